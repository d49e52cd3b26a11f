"""Fault isolation in the collector: failed attempts are classified, retried, and drop their group."""

import asyncio
import random

import pytest

from agentrl.agents.chat import ChatAgent
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.demos import ScriptedClient
from agentrl.rollout.tasks import make_tasks, retry_seed


class ScheduledFaults:
    """A FrozenLake whose steps fail on a schedule: `faults[(instance, step)]` = 'raise' | 'hang'."""

    created = 0

    def __init__(self, faults: dict[tuple[int, int], str]) -> None:
        self.lake = FrozenLakeEnv(max_steps=3)
        self.instructions = self.lake.instructions
        self.faults = faults
        self.instance = ScheduledFaults.created
        ScheduledFaults.created += 1
        self.steps = 0

    async def reset(self, seed=None, options=None):
        return await self.lake.reset(seed=seed, options=options)

    async def step(self, action):
        self.steps += 1
        fault = self.faults.get((self.instance, self.steps))
        if fault == "raise":
            raise RuntimeError(f"scheduled failure of instance {self.instance}")
        if fault == "hang":
            await asyncio.sleep(3600)
        return await self.lake.step(action)

    def sample_action(self, rng: random.Random) -> str:
        return self.lake.sample_action(rng)

    def close(self) -> None:
        self.lake.close()


def _collector(tokenizer, faults, engine=None, **kw):
    """A collector over scheduled-fault lakes, answered by the scripted client (instant replies,
    so timeouts are far above an episode's normal time) or by `engine`."""
    ScheduledFaults.created = 0
    client = ScriptedClient(tokenizer, lambda: ScheduledFaults(faults))
    agent = ChatAgent(tokenizer, SamplingParams(max_new_tokens=8), max_turns=3)
    if engine is None:
        return RolloutCollector.single(client.env_factory, agent, client, **kw)
    return RolloutCollector.single(lambda: ScheduledFaults(faults), agent, engine, **kw)


def test_a_failed_attempt_is_retried_with_a_fresh_env_and_a_new_sample(tiny_tokenizer):
    # Instance 1 (the second episode's first attempt) raises on its first step.
    collector = _collector(tiny_tokenizer, {(1, 1): "raise"}, max_retries=1)
    tasks = make_tasks(0, 1, 2, 2)
    result = collector.collect(tasks)
    assert result.failures["env"] == 1 and result.retries == 1
    assert result.failed_episodes == 0 and result.dropped_groups == 0
    assert len(result.trajectories) == 4
    assert "RuntimeError in step: scheduled failure of instance 1" in result.errors[0]
    retried = [t for t in result.trajectories if t.env_seed == tasks[1].env_seed]
    assert len(retried) == 2  # the retry keeps its env seed, so its group stays whole
    assert retry_seed(tasks[1].sampling_seed, 1) != tasks[1].sampling_seed


def test_retries_run_out_and_the_whole_group_is_dropped(tiny_tokenizer):
    # The scripted client answers without suspending, so episodes run one after the other and
    # episode 0's two attempts are instances 0 and 1; its group (episodes 0 and 1) is dropped whole.
    collector = _collector(tiny_tokenizer, {(0, 1): "raise", (1, 1): "raise"}, max_retries=1)
    tasks = make_tasks(0, 1, 2, 2)
    result = collector.collect(tasks)
    assert result.failures["env"] == 2 and result.failed_episodes == 1 and result.dropped_groups == 1
    assert {t.group_id for t in result.trajectories} == {1}
    assert len(result.trajectories) == 2
    m = result.metrics()
    assert m["rollout/failures_env"] == 2 and m["rollout/dropped_groups"] == 1


def test_a_hanging_env_times_out_and_is_retried(tiny_tokenizer):
    collector = _collector(tiny_tokenizer, {(2, 2): "hang"}, max_retries=1, timeout=1.0)
    result = collector.collect(make_tasks(0, 1, 2, 2))
    assert result.failures["timeout"] == 1 and result.failed_episodes == 0
    assert "episode_timeout=1.0s" in result.errors[0]
    assert len(result.trajectories) == 4


def test_agent_and_engine_failures_are_told_apart(tiny_tokenizer):
    class BrokenAgent:
        async def run_episode(self, task, env, llm):
            await env.reset(seed=task.env_seed)
            raise ValueError("agent bug")

    collector = _collector(tiny_tokenizer, {}, max_retries=0)
    collector.tags[""].agent = BrokenAgent()
    result = collector.collect(make_tasks(0, 1, 1, 2))
    assert result.failures["agent"] == 2 and not result.trajectories
    assert "ValueError: agent bug" in result.errors[0]


def test_engine_failures_are_counted_as_engine(tiny_model, tiny_tokenizer):
    engine = LocalEngine(tiny_model, eos_token_ids=(tiny_tokenizer.eos_token_id,),
                         pad_token_id=tiny_tokenizer.pad_token_id, seed=0, max_model_len=8)
    collector = _collector(tiny_tokenizer, {}, engine=engine, max_retries=0)  # every prompt is too long
    result = collector.collect(make_tasks(0, 1, 1, 2))
    assert result.failures["engine"] == 2 and result.failures["agent"] == 0
    assert "EngineError" in result.errors[0]


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_without_faults_the_collection_is_the_same_with_or_without_a_timeout(tiny_tokenizer, timeout):
    plain = _collector(tiny_tokenizer, {}).collect(make_tasks(0, 1, 2, 2))
    guarded = _collector(tiny_tokenizer, {}, timeout=timeout, max_retries=2).collect(make_tasks(0, 1, 2, 2))
    assert [t.token_ids for t in plain.trajectories] == [t.token_ids for t in guarded.trajectories]
    assert guarded.retries == 0 and not guarded.errors


class _OneReplyAgent:
    """A user's minimal agent: one reply, a trajectory built by hand, no tag or reset info copied."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def run_episode(self, task, env, llm):
        from agentrl.trajectory import TokenRecord, Trajectory

        obs, _ = await env.reset(seed=task.env_seed)
        record = TokenRecord()
        record.append_prompt(self.tokenizer.encode(obs, add_special_tokens=False))
        done = await llm.generate(record.token_ids, SamplingParams(max_new_tokens=4, seed=task.sampling_seed))
        record.append_generated(done.token_ids, done.logprobs, done.versions)
        _, reward, terminated, _, info = await env.step(self.tokenizer.decode(done.token_ids))
        record.set_turn_reward(reward)
        return Trajectory.from_record(record, task, [obs], success=bool(info.get("success")), terminated=terminated)


def test_every_agents_episodes_carry_their_tag_and_reset_info(tiny_model, tiny_tokenizer):
    # The eval baselines read the env's layout from reset_info: it must not depend on the agent copying it.
    engine = LocalEngine(tiny_model, eos_token_ids=(tiny_tokenizer.eos_token_id,),
                         pad_token_id=tiny_tokenizer.pad_token_id, seed=0)
    collector = RolloutCollector.single(lambda: FrozenLakeEnv(map_name=None, max_steps=3),
                                        _OneReplyAgent(tiny_tokenizer), engine, tag="lake")
    result = collector.collect(make_tasks(0, 1, 2, 1, tags=["lake", "lake"]))
    assert len(result.trajectories) == 2 and not result.errors
    for t in result.trajectories:
        assert t.tag == "lake" and t.reset_info["optimal_success"] in (0.0, 1.0)
        assert t.reset_info["map"].count("/") == 3  # a 4x4 board, rows joined by "/"
    assert result.trajectories[0].reset_info["map"] != result.trajectories[1].reset_info["map"]
