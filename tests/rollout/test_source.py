"""Rollout sources: both play the task source's groups, hand back the engine as they found it
after an evaluation, and keep what a resumed run needs."""

import copy

import pytest

from agentrl.agents.chat import ChatAgent
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.source import OnPolicySource, StreamSource, rollout_source
from agentrl.rollout.tasks import TaskSource

TASKS = TaskSource(seed=0, group_size=2, train_tags=("", ""), val_tags=("", "", ""))


def _parts(model, tok):
    engine = LocalEngine(copy.deepcopy(model), eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, seed=0)
    agent = ChatAgent(tok, SamplingParams(max_new_tokens=4), max_turns=2)
    return RolloutCollector.single(lambda: FrozenLakeEnv(max_steps=2), agent, engine), engine


def test_the_mode_picks_the_source(tiny_model, tiny_tokenizer):
    collector, engine = _parts(tiny_model, tiny_tokenizer)
    assert isinstance(rollout_source(collector, engine, TASKS, 0), OnPolicySource)
    assert isinstance(rollout_source(collector, engine, TASKS, 2), StreamSource)


@pytest.mark.parametrize("k", [0, 1])
def test_a_source_plays_the_steps_groups_and_evaluation_leaves_no_trace(tiny_model, tiny_tokenizer, k):
    collector, engine = _parts(tiny_model, tiny_tokenizer)
    source = rollout_source(collector, engine, TASKS, k)
    result = source.evaluate()  # before start: in the caller's thread
    assert [t.env_seed for t in result.trajectories] == [t.env_seed for t in TASKS.evaluation()]
    assert not engine.sched.parked and source.pop_metrics()["perf/engine_requests"] == 0.0
    source.start()
    try:
        step = source.collect(1, source.policy_version)
        assert len(step.groups) == TASKS.n_groups and all(len(g) == 2 for g in step.groups)
        if k == 0:  # on-policy, step 1 plays exactly the task source's step 1
            assert [t.env_seed for g in step.groups for t in g] == [t.env_seed for t in TASKS.step(1)]
        assert source.pop_metrics()["perf/engine_requests"] > 0
        assert source.load_weights(engine.model.state_dict()) == 1 == source.policy_version
        source.evaluate()  # with a stream running: on its thread
        state = source.checkpoint()
        assert state["engine"]["policy_version"] == 1 and not engine.sched.parked
        assert (state["stream"] is None) == (k == 0)
    finally:
        source.close()
    if k:
        assert source.checkpoint()["stream"] == state["stream"]  # the position outlives the stream
        source.evaluate()  # the engine is the caller's again


def test_a_restored_source_continues_the_engine_and_the_streams_position(tiny_model, tiny_tokenizer):
    collector, engine = _parts(tiny_model, tiny_tokenizer)
    source = StreamSource(collector, engine, TASKS, max_staleness=1)
    seed_state = engine.state_dict()
    source.restore({"engine": {**seed_state, "policy_version": 5}, "stream": {"watermark": 4, "above": [], "replaced": 0}})
    assert source.policy_version == 5
    source.start()
    try:
        step = source.collect(3, 5)
        # The first groups played are those after the consumed watermark: groups 4 and 5 (step 3).
        assert sorted(t.group_id for g in step.groups for t in g) == [4, 4, 5, 5]
    finally:
        source.close()
