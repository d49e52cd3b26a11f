"""model.path on a locally built Qwen2.5-0.5B-shaped folder (the real widths and vocabulary, one
layer for CI) trains a step with the settings a GPU run uses: bfloat16 weights with float32
master copies, packed micro-batches under a token budget, gradient checkpointing."""

import json

import torch
from safetensors.torch import load_file

from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.models.qwen_shape import build_qwen_shaped
from agentrl.runtime.local import train
from agentrl.train.checkpoint import latest_checkpoint, load_state


def test_a_qwen_shaped_folder_trains_one_step_in_bfloat16(tmp_path):
    folder = build_qwen_shaped("qwen2.5-0.5b", tmp_path / "qwen", num_hidden_layers=1)
    shape = json.loads((folder / "config.json").read_text())
    assert (shape["hidden_size"], shape["vocab_size"], shape["num_key_value_heads"]) == (896, 151936, 2)
    run = tmp_path / "run"
    cfg = load_config("configs/frozen_lake.yaml", [
        f"model.path={folder}", "model.dtype=bfloat16", "model.use_remove_padding=true",
        "model.enable_gradient_checkpointing=true", "actor.max_tokens_per_micro_batch=256",
        "actor.entropy_coeff=0.01",  # a gradient even if every episode of random weights scores alike
        # One group of two episodes: the 151,936-row head makes every trained sequence cost; the
        # budget above still splits them into micro-batches of their own.
        "rollout.batch_size=2", "rollout.group_size=2", "actor.ppo_mini_batch_size=2", "actor.micro_batch_size=2",
        # Every generated id costs a pass through that head in bfloat16 (emulated on a CPU without
        # it): a few ids a reply, and no evaluation (the rollout already generates in bfloat16).
        "rollout.max_new_tokens=4", "trainer.test_freq=0",
        "env.max_turns=1", "env.args.max_steps=1", "trainer.total_steps=1", "trainer.eval_episodes=2", "trainer.progress=false",
        "trainer.logger=[jsonl]", f"run_dir={run}"])
    summary = train(cfg, log=lambda m: None)
    assert summary["steps"] == 1
    (step,) = [r for r in read_jsonl(run / "metrics.jsonl") if "loss/policy" in r]
    assert step["policy/grad_norm"] > 0 and abs(step["loss/policy"]) < 1e3
    assert step["rollout/sequence_tokens"] > 40  # Qwen's default system message opens every episode
    ckpt = latest_checkpoint(run / "checkpoints")
    after, before = load_file(str(ckpt / "model.safetensors")), load_file(str(folder / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in after.values())
    assert any(not torch.equal(after[k], before[k]) for k in before)
    masters = load_state(ckpt)["master_weights"]  # what an exact resume needs beyond the rounded weights
    assert masters and all(m.dtype == torch.float32 for m in masters.values())
