"""rollout.on_truncation: what a truncated episode means for training (zero, bootstrap, drop), on
short runs of two env tags: FrozenLake in one turn (every episode ends truncated at max_turns,
no move can reach the goal or a hole) and a one-answer math question (every episode terminates)."""

import json

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.runtime.local import train

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
        "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
        "rollout.batch_size=8", "rollout.group_size=4", "actor.ppo_mini_batch_size=8", "actor.micro_batch_size=4",
        "trainer.total_steps=2", "trainer.test_freq=0", "trainer.eval_episodes=2",
        "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]"]
GAE = ["algorithm.adv_estimator=gae", "critic.enable=true", "critic.ppo_mini_batch_size=8", "critic.micro_batch_size=4"]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


TWO_TAGS = """
custom_envs:
  lake: {type: frozen_lake, max_turns: 1, args: {map_name: "4x4", is_slippery: false}}
  sum: {type: math, max_turns: 1, args: {min_operand: 0, max_operand: 2, num_ops: 1, ops: "+"}}
train_env_manager: {tags: [lake, sum], n_groups: [1, 1]}
val_env_manager: {tags: [lake, sum], n_groups: [1, 1]}
"""


def _run(tmp_path, cache, name, *overrides):
    (tmp_path / "two_tags.yaml").write_text(TWO_TAGS)
    cfg = load_config(tmp_path / "two_tags.yaml", [*TINY, *overrides, f"run_dir={tmp_path / name}",
                                                   f"model.cache_dir={cache}"])
    train(cfg, log=lambda m: None)
    return [r for r in _rows(tmp_path / name) if "loss/policy" in r]


def test_drop_trains_on_the_episodes_that_were_not_truncated(tmp_path, run_model_cache):
    # every run here shares one warm start (the critic and on_truncation are not part of it)
    zero = _run(tmp_path, run_model_cache, "zero")
    drop = _run(tmp_path, run_model_cache, "drop", "rollout.on_truncation=drop")
    assert "rollout/dropped_truncated" not in zero[0]
    assert all(r["rollout/truncated_max_turns"] == 0.5 and r["rollout/kept_groups"] == 2 for r in zero)
    # Each step the lake's group (4 episodes, all truncated) leaves; the math group trains alone.
    assert all(r["rollout/dropped_truncated"] == 4 and r["rollout/kept_groups"] == 1 for r in drop)
    assert all(r["rollout/truncated_max_turns"] == 0.0 and "env/lake/success" not in r for r in drop)


def test_bootstrap_credits_truncated_episodes_with_the_critics_value(tmp_path, run_model_cache):
    zero = _run(tmp_path, run_model_cache, "zero", *GAE)
    boot = _run(tmp_path, run_model_cache, "boot", *GAE, "rollout.on_truncation=bootstrap")
    assert zero[0]["rollout/truncated_max_turns"] == 0.5
    # Step 1: the critic's fresh value head is zero, so there is nothing to bootstrap yet; the same
    # update follows. Step 2: the same episodes, and the truncated ones' targets take in the value.
    assert boot[0] == {**zero[0], **{k: v for k, v in boot[0].items() if k.startswith("perf/")}}
    assert boot[1]["rollout/success"] == zero[1]["rollout/success"]
    assert boot[1]["loss/value"] != zero[1]["loss/value"]  # the critic learns other targets


def test_bootstrap_without_a_critic_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.on_truncation=bootstrap"])
    assert str(err.value).startswith("rollout.on_truncation=bootstrap takes the critic's value") and "\n" not in str(err.value)
