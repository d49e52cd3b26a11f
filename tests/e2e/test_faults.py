"""Training goes on through envs that raise and hang; only a broken step stops it, with a clear error."""

import asyncio
import random

import pytest

from agentrl.config import load_config
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.errors import RolloutError
from agentrl.metrics import read_jsonl
from agentrl.models.embedded import cache_root, tiny_cache_key
from agentrl.registry import register_env
from agentrl.rollout.tasks import EVAL_SEED_BASE
from agentrl.runtime.assembly.policy import load_policy
from agentrl.runtime.local import train
from agentrl.runtime.assembly.plan import plan

from test_train import TINY  # tests/e2e is on sys.path (pytest prepend mode)


class FlakyLake:
    """FrozenLake whose steps raise with `raise_prob` and hang forever with `hang_prob`.

    Faults are drawn from a stream seeded by the episode's env seed and attempt, so a run meets
    the same faults whatever the order in which episodes (and their retries) start.
    """

    attempts: dict = {}  # env seed -> resets so far (attempt 0, then each retry)

    def __init__(self, raise_prob: float = 0.0, hang_prob: float = 0.0, eval_safe: bool = False,
                 **lake_args) -> None:
        self.lake = FrozenLakeEnv(**lake_args)
        self.instructions = self.lake.instructions
        self.raise_prob, self.hang_prob, self.eval_safe = raise_prob, hang_prob, eval_safe
        self.rng = random.Random(0)
        self.safe = False

    async def reset(self, seed=None, options=None):
        attempt = FlakyLake.attempts[seed] = FlakyLake.attempts.get(seed, -1) + 1
        self.rng = random.Random(f"{seed}/{attempt}")
        self.safe = self.eval_safe and seed >= EVAL_SEED_BASE  # evaluation episodes never fail
        return await self.lake.reset(seed=seed, options=options)

    async def step(self, action):
        u = 1.0 if self.safe else self.rng.random()
        if u < self.raise_prob:
            raise RuntimeError("the lake cracked")
        if u < self.raise_prob + self.hang_prob:
            await asyncio.sleep(3600)
        return await self.lake.step(action)

    def sample_action(self, rng):
        return self.lake.sample_action(rng)

    def close(self):
        self.lake.close()


register_env("flaky_lake", FlakyLake, overwrite=True)


@pytest.fixture(scope="module")
def tiny_path(run_model_cache):
    """A warm-started tiny model for FrozenLake, loaded by the flaky runs through model.path."""
    cfg = load_config("configs/frozen_lake.yaml", [*TINY, f"model.cache_dir={run_model_cache}"])
    load_policy(plan(cfg), log=lambda m: None)  # the test run's cache: other modules share it
    return cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"


def _flaky_cfg(tmp_path, tiny_path, *extra):
    return load_config("configs/frozen_lake.yaml", [
        *TINY, f"model.path={tiny_path}", f"run_dir={tmp_path}", "env.type=flaky_lake",
        "rollout.batch_size=8", "rollout.group_size=2", "actor.ppo_mini_batch_size=8", "trainer.total_steps=3",
        *extra])


@pytest.mark.parametrize("k", [0, 1])
def test_training_goes_on_through_raising_and_hanging_envs(tmp_path, tiny_path, k):
    FlakyLake.attempts = {}
    cfg = _flaky_cfg(tmp_path, tiny_path, "env.args.raise_prob=0.1", "env.args.hang_prob=0.05",
                     "rollout.episode_timeout=5.0", "rollout.max_retries=1", "rollout.max_failed_fraction=1.0",
                     f"rollout.max_staleness={k}")
    summary = train(cfg, log=lambda m: None)
    assert summary["steps"] == 3
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "rollout/kept_groups" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    if k == 0:
        # On-policy a step waits for all its episodes, so the faults met are the same on every
        # machine. The stream (k = 1) trains on the first groups to finish, which depend on the
        # clock: a hung group may still be waiting out its timeouts when training ends.
        assert sum(r["rollout/failures_env"] for r in rows) > 0
        assert sum(r["rollout/failures_timeout"] for r in rows) > 0
        assert sum(r["rollout/dropped_groups"] for r in rows) > 0
        assert sum(r["rollout/retries"] for r in rows) > 0
    for r in rows:  # no partial group is ever trained on
        assert r.get("rollout/episodes", 0.0) == r["rollout/kept_groups"] * 2
        assert r["rollout/kept_groups"] == 4 - r["rollout/dropped_groups"]
    errors = read_jsonl(tmp_path / "errors.jsonl") if (tmp_path / "errors.jsonl").exists() else []
    kinds = {e["kind"] for e in errors}
    assert kinds == {"env", "timeout"} if k == 0 else kinds <= {"env", "timeout"}
    assert all("the lake cracked" in e["error"] for e in errors if e["kind"] == "env")


@pytest.mark.parametrize("k", [0, 1])
def test_a_step_where_most_episodes_fail_stops_training_with_a_clear_error(tmp_path, tiny_path, k):
    cfg = _flaky_cfg(tmp_path, tiny_path, "env.args.raise_prob=1.0", "env.args.eval_safe=true", "rollout.max_retries=1",
                     "rollout.max_failed_fraction=0.5", f"rollout.max_staleness={k}")
    with pytest.raises(RolloutError, match=r"step 1: 8 of 8 episodes failed every attempt \(more than "
                                           r"rollout.max_failed_fraction=0.5\); first error: env: .*the lake cracked"):
        train(cfg, log=lambda m: None)


@pytest.mark.parametrize("k", [0, 1])
def test_an_evaluation_where_every_episode_fails_stops_the_run_instead_of_reporting_zero(tmp_path, tiny_path, k):
    """An evaluation with no episode left would report success 0.0 for an env that never ran."""
    cfg = _flaky_cfg(tmp_path, tiny_path, "env.args.raise_prob=1.0", "rollout.max_retries=1",
                     "rollout.max_failed_fraction=1.0", f"rollout.max_staleness={k}")
    with pytest.raises(RolloutError, match=r"^evaluation: 2 of 2 episodes failed every attempt \(every one of them\); "
                                           r"first error: env: .*the lake cracked"):
        train(cfg, log=lambda m: None)


def test_a_step_where_every_episode_fails_stops_even_when_failures_are_tolerated(tmp_path, tiny_path):
    """rollout.max_failed_fraction=1.0 tolerates failed groups, not a step with nothing to train on."""
    cfg = _flaky_cfg(tmp_path, tiny_path, "env.args.raise_prob=1.0", "env.args.eval_safe=true", "rollout.max_retries=0",
                     "rollout.max_failed_fraction=1.0")
    with pytest.raises(RolloutError, match=r"^step 1: 8 of 8 episodes failed every attempt \(every one of them\)"):
        train(cfg, log=lambda m: None)
