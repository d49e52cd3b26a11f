"""End-to-end: the shipped GEM and reasoning-gym configs train the embedded model and log their references."""

import json

import pytest

from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

TINY = [
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=2", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "trainer.total_steps=2", "trainer.test_freq=1", "trainer.eval_episodes=4", "trainer.save_freq=0",
    "trainer.progress=false", "trainer.logger=[jsonl]",
]


def _run(tmp_path, config, extra=()):
    cfg = load_config(config, [*TINY, *extra, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}"])
    summary = train(cfg, log=lambda m: None)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    return summary, [r for r in rows if "eval/success" in r], sample


def test_gem_config_trains_against_gems_random_policy(tmp_path):
    pytest.importorskip("gem", reason="GEM is not installed (pip install 'agentrl[gem]')")
    summary, evals, sample = _run(tmp_path, "configs/gem_guess_number.yaml")
    assert [r["step"] for r in evals] == [0, 1, 2]
    # the random policy on the 4 evaluated secrets, the same at every evaluation
    assert len({r["eval/baseline_random"] for r in evals}) == 1 and 0.0 <= evals[0]["eval/baseline_random"] <= 1.0
    assert summary["eval_baseline_random"] == evals[-1]["eval/baseline_random"]
    assert "You are playing Guess The Number" in sample["text"] and "Enter your" in sample["text"]


def test_reasoning_gym_config_trains_with_the_retry_agent(tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'agentrl[reasoning-gym]')")
    summary, evals, sample = _run(tmp_path, "configs/reasoning_gym.yaml")
    assert [r["step"] for r in evals] == [0, 1, 2]
    for r in evals:
        assert 0.0 < r["eval/baseline_most_frequent_answer"] <= 1.0
        assert r["eval/reasoning_gym/success_at_1"] <= r["eval/reasoning_gym/success_at_3"]
    assert "How many 1 bits are there in the binary representation of the number" in sample["text"]
