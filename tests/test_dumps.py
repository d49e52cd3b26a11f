"""Trajectory dumps (agentrl/dumps.py): token-exact, bounded per step, atomic, cut on resume."""

import gzip
import json

import pytest
import torch

from agentrl.dumps import TrajectoryDumper, cut_dumps, dump_path, list_dumps, read_dump, select_groups
from agentrl.train.batch import pack
from agentrl.trajectory import Trajectory


def traj(group, n_prompt, reply, seed=0, success=False):
    ids = list(range(10, 10 + n_prompt)) + list(reply)
    mask = [0] * n_prompt + [1] * len(reply)
    logp = [0.0] * n_prompt + [-0.5 - 0.1 * k for k in range(len(reply))]
    versions = [-1] * n_prompt + [3] * len(reply)
    return Trajectory(ids, mask, logp, versions, [1.0 if success else 0.0], [len(ids) - 1], group, seed,
                      success=success, terminated=True, tag="toy")


def scored(trajs, pad=0):
    batch = pack(trajs, pad)
    batch.old_logprobs = batch.behaviour_logprobs - 0.01 * batch.loss_mask
    positions = torch.arange(batch.input_ids.numel(), dtype=torch.float32).view_as(batch.input_ids)
    batch.advantages = positions * batch.loss_mask
    batch.returns = batch.advantages * 2
    return batch


def test_a_dump_holds_the_trained_ids_and_numbers(tmp_path, tiny_tokenizer):
    reply = tiny_tokenizer.encode("<answer>Left</answer>")
    trajs = [traj(0, 5, reply, success=True), traj(0, 7, reply[:3]), traj(1, 4, reply)]
    batch = scored(trajs)
    path = TrajectoryDumper(tmp_path, tiny_tokenizer, max_tokens=10_000).write(7, trajs, batch, 4, "grpo")
    assert path == dump_path(tmp_path, 7) and list_dumps(tmp_path) == [(7, path)]
    d = read_dump(path)
    assert (d["step"], d["policy_version"], d["estimator"], d["episodes_total"]) == (7, 4, "grpo", 3)
    for row, (t, ep) in enumerate(zip(trajs, d["episodes"])):
        assert ep["ids"] == t.token_ids and ep["mask"] == "".join(map(str, t.loss_mask))
        gen = [k for k, m in enumerate(t.loss_mask) if m and k > 0]
        assert len(ep["lp"]) == len(ep["adv"]) == len(ep["ver"]) == t.num_generated
        assert ep["lp"] == pytest.approx([t.logprobs[k] for k, m in enumerate(t.loss_mask) if m], abs=1e-4)
        assert ep["adv"][-len(gen):] == pytest.approx(batch.advantages[row, gen].tolist(), abs=1e-4)
        assert ep["ver"] == [3] * t.num_generated and "ref" not in ep  # no reference in this run
        assert (ep["group"], ep["tag"], ep["success"], ep["rewards"]) == (t.group_id, "toy", t.success, t.rewards)
    # every id's piece is its own decode, for display; joined they give back the reply's text
    pieces = d["pieces"]
    assert "".join(pieces[str(i)] for i in reply) == tiny_tokenizer.decode(reply)


def test_a_step_dump_keeps_whole_groups_within_the_bound(tmp_path, tiny_tokenizer):
    trajs = [traj(g, 20, [1, 2, 3, 4, 5], seed=g) for g in range(3) for _ in range(2)]  # 25 ids each, 50 a group
    assert select_groups(trajs, 120) == [0, 1, 2, 3]  # two groups fit in 120, the third would not
    d = read_dump(TrajectoryDumper(tmp_path, tiny_tokenizer, max_tokens=120).write(1, trajs, scored(trajs), 0, "grpo"))
    assert [e["group"] for e in d["episodes"]] == [0, 0, 1, 1]
    assert d["tokens_kept"] == 100 <= d["max_tokens"] and d["tokens_total"] == 150
    # a group larger than the bound is cut to it: the step's size stays bounded
    d = read_dump(TrajectoryDumper(tmp_path, tiny_tokenizer, max_tokens=30).write(2, trajs, scored(trajs), 0, "grpo"))
    assert sum(len(e["ids"]) for e in d["episodes"]) == 30
    assert d["episodes"][-1]["cut_at"] == 5 and len(d["episodes"][-1]["lp"]) == 0


def test_writes_are_atomic_and_a_resume_cuts_later_dumps(tmp_path, tiny_tokenizer):
    trajs = [traj(0, 3, [1, 2]), traj(0, 3, [2, 1])]
    dumper = TrajectoryDumper(tmp_path, tiny_tokenizer, max_tokens=100)
    for step in (2, 4, 6):
        dumper.write(step, trajs, scored(trajs), step, "grpo")
    (tmp_path / "dumps" / ".step_000008.json.gz.123.tmp").write_bytes(b"torn")  # a write cut off mid-way
    assert [s for s, _ in list_dumps(tmp_path)] == [2, 4, 6]
    assert cut_dumps(tmp_path, 4) == 1
    assert [s for s, _ in list_dumps(tmp_path)] == [2, 4]
    # the replayed step is written again under its name: one file per step, never two
    dumper.write(4, trajs, scored(trajs), 9, "grpo")
    assert [s for s, _ in list_dumps(tmp_path)] == [2, 4] and read_dump(dump_path(tmp_path, 4))["policy_version"] == 9


def test_a_non_finite_number_is_written_as_null(tmp_path, tiny_tokenizer):
    trajs = [traj(0, 3, [1, 2]), traj(0, 3, [2, 1])]
    batch = scored(trajs)
    batch.advantages[0, 3] = float("nan")
    path = TrajectoryDumper(tmp_path, tiny_tokenizer, max_tokens=100).write(1, trajs, batch, 0, "grpo")
    json.loads(gzip.decompress(path.read_bytes()))  # strict JSON
    assert read_dump(path)["episodes"][0]["adv"] == [None, 4.0]
