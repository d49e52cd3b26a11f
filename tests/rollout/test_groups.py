"""Env groups: each batch holds the configured number of groups of each tag, a group shares one
env seed, and the collector plays every task with its own tag's env and agent."""

from collections import Counter

import pytest

from agentrl.agents.chat import ChatAgent
from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.llm.engine import SamplingParams
from agentrl.rollout.collector import RolloutCollector, TagSpec
from agentrl.rollout.tasks import make_tasks
from agentrl.rollout.demos import ScriptedClient
from agentrl.rollout.stats import tag_metrics, truncation_metrics

MIXED = ["custom_envs={lake: {type: frozen_lake, max_turns: 4}, sums: {type: math, max_turns: 1, "
         "args: {max_operand: 4}}}"]


def test_batch_plan_follows_tags_and_n_groups():
    cfg = load_config(None, [*MIXED, "train_env_manager.tags=[sums, lake]", "train_env_manager.n_groups=[3, 1]",
                             "val_env_manager.tags=[lake]", "trainer.eval_episodes=5"])
    assert cfg.group_tags("train") == ["sums", "sums", "sums", "lake"]  # 32 / 8 = 4 groups
    assert cfg.group_tags("val") == ["lake"] * 5
    even = load_config(None, [*MIXED, "rollout.batch_size=16", "rollout.group_size=4", "trainer.eval_episodes=6"])
    assert even.group_tags("train") == ["lake", "lake", "sums", "sums"]  # no tags: every env, split evenly
    assert even.group_tags("val") == ["lake"] * 3 + ["sums"] * 3  # val defaults to the training tags
    one = load_config(None, [])
    assert one.group_tags("train") == ["frozen_lake"] * 4 and list(one.env_definitions()) == ["frozen_lake"]


def test_tasks_counts_and_seeds_come_out_as_configured():
    cfg = load_config(None, [*MIXED, "train_env_manager.n_groups=[1, 3]", "rollout.group_size=8"])
    plan = cfg.group_tags("train")
    tasks = make_tasks(cfg.seed, 5, len(plan), cfg.rollout.group_size, tags=plan)
    assert Counter(t.tag for t in tasks) == {"lake": 8, "sums": 24}
    groups = {}
    for t in tasks:
        groups.setdefault(t.group_id, []).append(t)
    assert len(groups) == 4 and all(len(g) == 8 for g in groups.values())
    for g in groups.values():
        assert len({t.env_seed for t in g}) == 1 and len({t.tag for t in g}) == 1  # one env seed per group
        assert len({t.sampling_seed for t in g}) == 8  # but each episode samples its own replies
    assert len({g[0].env_seed for g in groups.values()}) == 4
    assert tasks == make_tasks(cfg.seed, 5, len(plan), 8, tags=plan)  # reproducible
    # a group's seeds depend on its index, not its tag: the one-env run keeps its seeds
    untagged = make_tasks(cfg.seed, 5, 4, 8)
    assert [t.env_seed for t in untagged] == [t.env_seed for t in tasks]
    with pytest.raises(ValueError, match="3 tags for 4 groups"):
        make_tasks(0, 0, 4, 2, tags=["a"] * 3)


@pytest.mark.parametrize("overrides, match", [
    (["train_env_manager.tags=[lake, sumz]"], "unknown tag 'sumz'. Did you mean 'sums'"),
    (["val_env_manager.tags=[lak]"], "val_env_manager.tags: unknown tag 'lak'. Did you mean 'lake'"),
    (["train_env_manager.tags=[lake, sums]", "train_env_manager.n_groups=[4]"], "has 1 entries but .*has 2"),
    (["train_env_manager.n_groups=[2, 1]"], r"sums to 3 groups, but rollout.batch_size=32 / rollout.group_size=8 gives 4"),
    (["rollout.batch_size=24", "actor.ppo_mini_batch_size=8", "actor.micro_batch_size=8"],
     "3 groups, which do not split evenly over 2 tags"),
    (["trainer.eval_episodes=7"], "trainer.eval_episodes=7 gives 7 groups, which do not split evenly"),
    (["train_env_manager.tags=[lake, lake]"], "names a tag twice"),
    (["train_env_manager.n_groups=[0, 4]"], r"n_groups\[0\]=0 must be a positive integer .*leave a tag out"),
    (["env.max_turns=3"], "both env and custom_envs are set"),
    (["custom_envs.lake.max_turns=0"], "custom_envs.lake.max_turns=0 must be a positive integer"),
    (["custom_envs.lake.agnet.type=chat"], "Did you mean 'custom_envs.lake.agent'"),
])
def test_bad_env_groups_fail_before_any_work(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, [*MIXED, *overrides])
    assert "\n" not in str(e.value)


def test_collector_plays_each_task_with_its_tags_env_and_agent(tiny_tokenizer):
    from agentrl.envs.frozen_lake import FrozenLakeEnv
    from agentrl.envs.math import MathEnv
    from agentrl.envs.math_grader import shutdown_grader

    client = ScriptedClient(tiny_tokenizer)
    sampling = SamplingParams(max_new_tokens=8)
    collector = RolloutCollector({
        "lake": TagSpec(client.wrap(lambda: FrozenLakeEnv(map_name="4x4")), ChatAgent(tiny_tokenizer, sampling, 3)),
        "sums": TagSpec(client.wrap(lambda: MathEnv(max_operand=4)), ChatAgent(tiny_tokenizer, sampling, 1)),
    }, client)
    try:
        result = collector.collect(make_tasks(0, 0, 4, 2, tags=["lake", "sums", "sums", "lake"]))
    finally:
        shutdown_grader()
    assert not result.errors
    by_tag = Counter(t.tag for t in result.trajectories)
    assert by_tag == {"lake": 4, "sums": 4}
    for t in result.trajectories:
        text = tiny_tokenizer.decode(t.token_ids)
        assert ("FrozenLake" in text) == (t.tag == "lake") and ("What is" in text) == (t.tag == "sums")
        assert t.num_turns <= (3 if t.tag == "lake" else 1)
    metrics = tag_metrics(result.trajectories, "env")
    assert metrics["env/lake/episodes"] == 4 and metrics["env/sums/episodes"] == 4
    assert {"env/sums/success", "env/sums/return", "env/sums/turns", "env/sums/grader_timeout",
            "env/lake/optimal_success"} <= set(metrics)
    assert "env/lake/grader_timeout" not in metrics  # info["metrics"] keys stay with their own tag
    assert metrics["env/sums/turns"] == 1.0
    assert sum(truncation_metrics(result.trajectories).values()) <= 1.0


def test_unknown_tag_in_tasks_is_a_wiring_error(tiny_tokenizer):
    collector = RolloutCollector.single(lambda: None, None, None, tag="a")
    with pytest.raises(ValueError, match=r"tags \['b'\]"):
        collector.collect(make_tasks(0, 0, 1, 1, tags=["b"]))
