"""OpenAI-client agents trained through sessions: every trajectory holds exactly the ids the
client was returned, with the loss mask on them; the same episodes as the chat agent; history
rewrites become counted segments; rewards returned, posted or from the env; bad entries fail
in one line."""

import asyncio
import copy
from pathlib import Path

import pytest
from helpers import segments

from agentrl.agents.chat import ChatAgent
from agentrl.agents.openai import OpenAIAgent, resolve_entry
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.demos import ScriptedClient
from agentrl.trajectory import Task

HERE = Path(__file__).parent
EXAMPLE = str(HERE.parents[1] / "examples" / "openai_frozen_lake.py") + ":run"


def _entry(name):
    return f"{HERE / 'openai_agents.py'}:{name}"


def _lake():
    return FrozenLakeEnv(map_name="4x4", is_slippery=False, max_steps=4)


def _agent(tok, entry, max_turns=4):
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(tok.eos_token_id,))
    return OpenAIAgent(tok, sp, max_turns, entry=entry)


TASKS = [Task(env_seed=i, group_id=i // 2, sampling_seed=1000 + i) for i in range(6)]


def test_trajectories_hold_exactly_the_ids_the_client_was_returned(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    engine = LocalEngine(copy.deepcopy(tiny_model), eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                         tokenizer=tok)
    entry = _entry("recording")
    returned = resolve_entry(entry).__globals__["RETURNED"]
    result = RolloutCollector.single(_lake, _agent(tok, entry), engine).collect(TASKS)
    assert not result.errors and result.segments == 0 and len(result.trajectories) == len(TASKS)
    for traj in result.trajectories:
        spans = segments(traj.loss_mask)
        assert [traj.token_ids[a:b] for a, b in spans] == returned[traj.env_seed]  # id for id, mask exactly there
        assert sum(traj.loss_mask) == sum(len(ids) for ids in returned[traj.env_seed])
        assert all(traj.logprobs[i] < 0 for a, b in spans for i in range(a, b))
        assert all(v == 0 for v, m in zip(traj.versions, traj.loss_mask) if m)
        assert traj.num_turns == len(spans) and traj.truncation_reason in (None, "env")


def test_the_example_agent_plays_the_chat_agents_episodes(tiny_tokenizer):
    """With the same replies (scripted, seeded per task and turn) the session builds the chat
    agent's token sequences, id for id."""
    tok = tiny_tokenizer
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(tok.eos_token_id,))
    runs = []
    for agent in (_agent(tok, EXAMPLE), ChatAgent(tok, sp, 4)):
        client = ScriptedClient(tok)
        runs.append(RolloutCollector.single(client.wrap(_lake), agent, client).collect(TASKS).trajectories)
    for mine, chat in zip(*runs):
        assert mine.token_ids == chat.token_ids and mine.loss_mask == chat.loss_mask
        assert mine.logprobs == chat.logprobs and mine.versions == chat.versions
        assert mine.rewards == chat.rewards and mine.reward_positions == chat.reward_positions
        assert (mine.success, mine.terminated, mine.truncation_reason) == (chat.success, chat.terminated,
                                                                          chat.truncation_reason)
        assert mine.turn_states == chat.turn_states


def test_a_rewritten_history_trains_as_counted_segments(tiny_tokenizer):
    tok = tiny_tokenizer
    client = ScriptedClient(tok)
    result = RolloutCollector.single(client.wrap(_lake), _agent(tok, _entry("amnesiac")), client).collect(TASKS[:2])
    per_episode = {}
    for traj in result.trajectories:
        per_episode.setdefault(traj.env_seed, []).append(traj)
    turns = {seed: len(trajs) for seed, trajs in per_episode.items()}
    assert result.segments == sum(n - 1 for n in turns.values()) > 0
    assert result.metrics()["rollout/segments"] == result.segments
    for seed, trajs in per_episode.items():
        assert all(len(segments(t.loss_mask)) == 1 for t in trajs)  # one call per segment here
        # Replay the episode's actions: each segment's reward is the episode's return from it on.
        env, own = _lake(), []
        asyncio.run(env.reset(seed=seed))
        for t in trajs:
            a, b = segments(t.loss_mask)[0]
            own.append(asyncio.run(env.step(tok.decode(t.token_ids[a:b - 1])))[1])
        assert [t.rewards for t in trajs] == [pytest.approx([sum(own[i:])]) for i in range(len(trajs))]


def test_rewards_returned_or_posted(tiny_tokenizer):
    tok = tiny_tokenizer
    client = ScriptedClient(tok)
    tasks = [Task(env_seed=0, group_id=0, sampling_seed=1), Task(env_seed=1, group_id=1, sampling_seed=2)]
    result = RolloutCollector.single(client.wrap(_lake), _agent(tok, _entry("scores_itself")), client).collect(tasks)
    assert not result.errors, result.errors
    assert [t.rewards for t in result.trajectories] == [[2.5], [-1.5]]


def test_a_bad_return_value_fails_the_episode_as_an_agent_error(tiny_tokenizer):
    client = ScriptedClient(tiny_tokenizer)
    agent = _agent(tiny_tokenizer, _entry("returns_text"))
    result = RolloutCollector.single(client.wrap(_lake), agent, client, max_retries=0).collect(TASKS[:1])
    assert result.failures["agent"] == 1 and "return the episode's reward as a finite number" in result.errors[0]


@pytest.mark.parametrize("entry, says", [
    ("no_colon", "must be 'module:function'"),
    ("agentrl_no_such_module:run", "cannot import 'agentrl_no_such_module': ModuleNotFoundError"),
    ("examples/no_such_file:run", "cannot import 'examples/no_such_file': FileNotFoundError"),
    (f"{HERE / 'openai_agents.py'}:missing", "has no 'missing'"),
    (f"{HERE / 'openai_agents.py'}:not_async", "is not an async function"),
    (f"{HERE / 'openai_agents.py'}:two_args", "cannot be called as two_args(client, env, task)"),
])
def test_bad_entries_fail_in_one_line(entry, says):
    with pytest.raises(ValueError, match=None) as err:
        resolve_entry(entry)
    assert says in str(err.value) and "\n" not in str(err.value)
