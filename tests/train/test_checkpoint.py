"""Checkpoints round-trip: weights, optimizer, trainer state and RNG streams come back exactly;
old ones are pruned, torn ones skipped."""

import copy
import random

import numpy as np
import pytest
import torch

from agentrl.errors import CheckpointError
from agentrl.train.checkpoint import (list_checkpoints, newest_readable, remove_partial, rng_state,
                                      save_checkpoint, set_rng_state, step_of)


def _trained(model):
    """A copy of `model` with one AdamW step taken, so the optimizer has moments to save."""
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.tensor([[5, 9, 12, 7]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return model, opt


def _draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_round_trip_restores_weights_optimizer_state_and_rng(tmp_path, tiny_model, tiny_tokenizer):
    model, opt = _trained(tiny_model)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = {"policy_version": 3, "summary": {"eval_success_before": 0.25}, "rng": rng_state()}
    want = _draws()  # what comes right after the saved RNG state
    path = save_checkpoint(tmp_path, 7, model, tiny_tokenizer, opt, state)
    assert path.name == "step_000007" and step_of(path) == 7

    _draws()  # move every stream on, then come back
    found, (weights, opt_state, loaded) = newest_readable(tmp_path, warn=pytest.fail)
    assert found == path and loaded["step"] == 7 and loaded["policy_version"] == 3
    assert loaded["summary"] == {"eval_success_before": 0.25}
    set_rng_state(loaded["rng"])
    assert _draws() == want

    fresh = copy.deepcopy(tiny_model)
    fresh.load_state_dict(weights, strict=False)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh_opt.load_state_dict(opt_state)
    saved = opt.state_dict()["state"]
    assert saved and all(torch.equal(saved[k]["exp_avg"], fresh_opt.state_dict()["state"][k]["exp_avg"]) for k in saved)


def test_only_the_newest_checkpoints_are_kept_and_a_later_timeline_is_dropped(tmp_path, tiny_model):
    model, opt = _trained(tiny_model)
    for step in (2, 4, 6, 8):
        save_checkpoint(tmp_path, step, model, None, opt, {}, keep=2)
    assert [step_of(p) for p in list_checkpoints(tmp_path)] == [6, 8]
    # A run resumed from step 6 that writes step 7 leaves the step-8 timeline behind.
    save_checkpoint(tmp_path, 7, model, None, opt, {}, keep=2)
    assert [step_of(p) for p in list_checkpoints(tmp_path)] == [6, 7]


def test_a_torn_newest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, tiny_model):
    model, opt = _trained(tiny_model)
    save_checkpoint(tmp_path, 1, model, None, opt, {"x": 1}, keep=3)
    newest = save_checkpoint(tmp_path, 2, model, None, opt, {"x": 2}, keep=3)
    data = (newest / "model.safetensors").read_bytes()
    (newest / "model.safetensors").write_bytes(data[: len(data) // 2])
    warnings = []
    found, (_, _, state) = newest_readable(tmp_path, warn=warnings.append)
    assert step_of(found) == 1 and state["x"] == 1
    assert len(warnings) == 1 and "step_000002" in warnings[0] and "falling back" in warnings[0]
    (found / "state.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no checkpoint in .* loads"):
        newest_readable(tmp_path, warn=warnings.append)


def test_a_checkpoint_without_its_manifest_is_not_loaded_unverified(tmp_path, tiny_model):
    model, opt = _trained(tiny_model)
    save_checkpoint(tmp_path, 1, model, None, opt, {"x": 1}, keep=3)
    newest = save_checkpoint(tmp_path, 2, model, None, opt, {"x": 2}, keep=3)
    (newest / "manifest.json").unlink()
    warnings = []
    found, (_, _, state) = newest_readable(tmp_path, warn=warnings.append)
    assert step_of(found) == 1 and state["x"] == 1
    assert len(warnings) == 1 and "step_000002" in warnings[0] and "manifest.json is missing" in warnings[0]


def test_a_cut_off_write_leaves_no_partial_folder_behind(tmp_path, tiny_model):
    model, opt = _trained(tiny_model)
    (tmp_path / ".tmp_step_000003").mkdir(parents=True)
    (tmp_path / ".tmp_step_000003" / "model.safetensors").write_bytes(b"half")
    assert list_checkpoints(tmp_path) == []  # never taken for a checkpoint
    remove_partial(tmp_path)
    assert not any(tmp_path.iterdir())
    assert newest_readable(tmp_path, warn=pytest.fail) is None
