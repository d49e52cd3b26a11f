"""Whatever an agent returns, the collector either keeps a trajectory the trainer can pack and learn
from, or records the episode as an agent failure; it never raises (hypothesis-fuzzed)."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.agents.chat import ChatAgent
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.llm.engine import SamplingParams
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.demos import ScriptedClient
from agentrl.rollout.tasks import make_tasks
from agentrl.train.batch import pack

VOCAB = 388  # ids of the tiny tokenizer (conftest.py: 384 and its added tokens), as a model built on it has
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5), st.lists(st.integers(-5, VOCAB + 5), max_size=4),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers()),
)
FIELDS = ["token_ids", "loss_mask", "logprobs", "versions", "rewards", "reward_positions", "turn_states", "success",
          "terminated", "truncation_reason", "invalid_actions", "truncated_replies", "info", "group_id", "env_seed",
          "segment", "reward_baseline"]


class ReplayingAgent:
    """Plays the chat agent's episode, then hands back `spoil(trajectory)`."""

    def __init__(self, tokenizer, spoil):
        self.inner = ChatAgent(tokenizer, SamplingParams(max_new_tokens=8), max_turns=2)
        self.spoil = spoil

    async def run_episode(self, task, env, llm):
        return self.spoil(await self.inner.run_episode(task, env, llm))


def _collect(tokenizer, spoil):
    assert len(tokenizer) == VOCAB
    client = ScriptedClient(tokenizer, lambda: FrozenLakeEnv(max_steps=2))
    collector = RolloutCollector.single(client.env_factory, ReplayingAgent(tokenizer, spoil), client, vocab_size=VOCAB)
    return collector.collect(make_tasks(0, 1, 1, 1))


def _usable(result, pad_id):
    """Kept trajectories pack, with ids inside the vocabulary and finite numbers the trainer reads."""
    if not result.trajectories:
        assert result.failures["agent"] == 1 and result.errors[0].startswith("agent: ")
        return
    batch = pack(result.trajectories, pad_id)
    assert 0 <= int(batch.input_ids.min()) and int(batch.input_ids.max()) < VOCAB
    assert all(math.isfinite(float(x)) for x in batch.behaviour_logprobs.flatten())
    assert all(math.isfinite(float(x)) for x in batch.token_rewards.flatten())


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])


@FUZZ
@given(field=st.sampled_from(FIELDS), value=JUNK, index=st.integers(0, 50))
def test_a_field_replaced_or_one_of_its_items_spoilt_is_kept_usable_or_failed(tiny_tokenizer, field, value, index):
    def spoil(t):
        current = getattr(t, field)
        if isinstance(current, list) and current and not isinstance(value, list):
            current = list(current)
            current[index % len(current)] = value
            setattr(t, field, current)
        else:
            setattr(t, field, copy.deepcopy(value))
        return t

    _usable(_collect(tiny_tokenizer, spoil), tiny_tokenizer.pad_token_id)


@FUZZ
@given(out=st.one_of(JUNK, st.lists(JUNK, max_size=3)))
def test_anything_but_trajectories_is_an_agent_failure(tiny_tokenizer, out):
    result = _collect(tiny_tokenizer, lambda t: out)
    assert not result.trajectories and result.failures["agent"] == 1


@pytest.mark.parametrize("how", ["as_is", "as_list"])
def test_a_well_formed_episode_is_kept(tiny_tokenizer, how):
    result = _collect(tiny_tokenizer, (lambda t: t) if how == "as_is" else (lambda t: [t]))
    assert len(result.trajectories) == 1 and not result.errors


@pytest.mark.parametrize("reward", [-(2**63) - 1, 2**70, 7])
def test_an_int_reward_beyond_int64_packs_as_the_number_it_is(tiny_tokenizer, reward):
    """A reward an env returns as a Python int outside int64 (found by the fuzz above) is a finite
    number: the episode is kept and packs into a batch holding that number, no OverflowError."""
    def spoil(t):
        t.rewards = [reward] + [0.0] * (len(t.rewards) - 1)
        return t

    result = _collect(tiny_tokenizer, spoil)
    assert len(result.trajectories) == 1, result.errors
    batch = pack(result.trajectories, tiny_tokenizer.pad_token_id)
    assert float(batch.token_rewards.sum()) == pytest.approx(float(reward), rel=1e-6)
