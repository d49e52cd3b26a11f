"""LoRA end to end on the embedded default: only the adapters change, they are what reaches the
engine, the checkpoint is a peft adapter that `PeftModel.from_pretrained` loads to the same
logprobs, `agentrl export` merges it, and a resumed run ends exactly where a straight one does."""

import shutil

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from agentrl.cli import main as cli_main
from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import open_run, train
from agentrl.train.actor import token_logprobs
from agentrl.train.checkpoint import latest_checkpoint

from test_train import TINY  # tests/e2e is on sys.path (pytest prepend mode)

# An entropy bonus gives a gradient even when a tiny run's groups all score alike (zero advantages).
LORA = [*TINY, "model.lora.rank=8", "model.lora.alpha=16", "actor.lr=0.05", "actor.entropy_coeff=0.01"]


def _logprobs(model, ids):
    with torch.no_grad():
        return token_logprobs(model.eval(), ids, torch.ones_like(ids))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, run_model_cache):
    """A 2-step LoRA run (checkpoint every step), the trainer that ran it, and its base weights before.
    Its base is the warm start of the test run's cache: LoRA is put on after it (other modules share it)."""
    run = tmp_path_factory.mktemp("lora") / "run"
    cfg = load_config("configs/frozen_lake.yaml", [*LORA, f"run_dir={run}", f"model.cache_dir={run_model_cache}"])
    with open_run(cfg, log=lambda m: None) as trainer:
        base_before = {n: p.detach().clone() for n, p in trainer.actor.model.named_parameters() if "lora_" not in n}
        trainer.fit()
    return run, cfg, trainer, base_before


def test_only_the_adapters_train_and_travel_to_the_engine(lora_run):
    run, _, trainer, base_before = lora_run
    policy = trainer.actor.model
    trained = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert any(float(p.detach().abs().max()) > 0 for n, p in trained.items() if "lora_B" in n)  # B started at 0
    for name, p in policy.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base_before[name]), f"base weight {name} changed"
    engine = trainer.rollout.engine.model.state_dict()
    for name, p in trained.items():  # the engine serves the trained adapters, bit for bit
        assert torch.equal(engine[name.removeprefix("base_model.model.")], p.detach()), name
    for name, p in policy.named_parameters():
        if "lora_" not in name:  # and still its own base, never reloaded
            assert torch.equal(engine[name.removeprefix("base_model.model.")], base_before[name]), name


def test_the_checkpoint_is_a_peft_adapter_with_the_same_logprobs_and_export_merges_it(lora_run):
    run, _, trainer, _ = lora_run
    ckpt = latest_checkpoint(run / "checkpoints")
    assert (ckpt / "adapter_model.safetensors").is_file() and (ckpt / "adapter_config.json").is_file()
    assert not (ckpt / "model.safetensors").exists()  # the base is not copied into every checkpoint
    base_dir = trainer.actor.model.peft_config["default"].base_model_name_or_path
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(ckpt))
    ids = torch.tensor([trainer.tokenizer.encode("user\nFrozenLake. Move P to G.\nassistant\n<answer>Right")])
    want = _logprobs(trainer.actor.model, ids)
    torch.testing.assert_close(_logprobs(loaded, ids), want, rtol=0, atol=1e-6)
    with loaded.disable_adapter():
        assert not torch.allclose(_logprobs(loaded, ids), want, atol=1e-3)  # the adapter matters here

    assert cli_main(["eval", str(run)]) == 0  # the run's base with the checkpoint's adapter
    assert cli_main(["export", str(run)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(run / "export")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_logprobs(merged, ids), want, rtol=0, atol=1e-5)


def test_a_resumed_lora_run_ends_exactly_as_the_straight_one(lora_run, tmp_path):
    run, cfg, _, _ = lora_run
    # What a run killed during step 2 leaves: step 1's checkpoint and rows, no summary.
    killed = tmp_path / "killed"
    shutil.copytree(run, killed, ignore=shutil.ignore_patterns("export", "step_000002", "summary.json"))
    cfg.run_dir = str(killed)
    train(cfg, resume=True, log=lambda m: None)
    strip = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_jsonl(run / "metrics.jsonl")]
    again = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_jsonl(killed / "metrics.jsonl")]
    assert again == strip and any(r["step"] == 2 and "reward/mean" in r for r in again)
    mine = load_file(str(latest_checkpoint(killed / "checkpoints") / "adapter_model.safetensors"))
    theirs = load_file(str(latest_checkpoint(run / "checkpoints") / "adapter_model.safetensors"))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
