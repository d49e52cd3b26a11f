"""ChatAgent's history window (agent.args.history_length): one sequence per turn, each prompt
holding the instructions, the last k turns and the current observation."""

import pytest

from agentrl.agents.chat import ChatAgent
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.errors import ConfigError
from agentrl.llm.conversation import TokenBudget
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.demos import ScriptedClient
from agentrl.rollout.stats import episode_stats
from agentrl.rollout.tasks import make_tasks


def _play(tokenizer, history_length, n_episodes=4, budget=None, max_turns=6):
    client = ScriptedClient(tokenizer, lambda: FrozenLakeEnv(map_name=None, max_steps=6))
    agent = ChatAgent(tokenizer, SamplingParams(max_new_tokens=8), max_turns=max_turns, budget=budget,
                      history_length=history_length)
    result = RolloutCollector.single(client.env_factory, agent, client).collect(make_tasks(0, 1, n_episodes, 1))
    assert not result.errors
    return result


def _episodes(trajs):
    out = []
    for t in trajs:
        if t.segment == 0:
            out.append([])
        out[-1].append(t)
    return out


def _replay_rewards(seed, replies):
    """The env's reward for each reply, from a fresh env replaying them."""
    import asyncio

    async def play():
        env = FrozenLakeEnv(map_name=None, max_steps=6)
        await env.reset(seed=seed)
        return [(await env.step(r))[1] for r in replies]

    return asyncio.run(play())


def _contains(seq, part):
    return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def test_each_turn_trains_as_its_own_sequence_holding_only_the_current_board(tiny_tokenizer):
    result = _play(tiny_tokenizer, history_length=0)
    episodes = _episodes(result.trajectories)
    assert len(episodes) == 4 and sum(len(e) for e in episodes) > 4  # episodes of several turns
    assert result.segments == sum(len(e) - 1 for e in episodes)
    for episode in episodes:
        assert [t.segment for t in episode] == list(range(len(episode)))
        replies = []
        for t in episode:
            assert t.num_turns == 1 and len(t.turn_states) == 1
            text = tiny_tokenizer.decode(t.token_ids)
            assert text.count("FrozenLake.") == 1 and text.count("P:") == 1  # instructions, one board
            assert t.turn_states[0] in text
            replies.append(tiny_tokenizer.decode([i for i, m in zip(t.token_ids, t.loss_mask) if m],
                                                 skip_special_tokens=True))
        rewards = _replay_rewards(episode[0].env_seed, replies)
        # each sequence's reward is the episode's return from its turn on
        assert [t.total_reward for t in episode] == pytest.approx([sum(rewards[k:]) for k in range(len(rewards))])
        assert len({(t.success, t.terminated, t.truncation_reason) for t in episode}) == 1


def test_a_window_of_one_holds_the_previous_turn_and_its_reply_ids_verbatim(tiny_tokenizer):
    episodes = _episodes(_play(tiny_tokenizer, history_length=1).trajectories)
    assert any(len(e) >= 3 for e in episodes)
    for episode in episodes:
        for before, t in zip(episode, episode[1:]):
            reply = [i for i, m in zip(before.token_ids, before.loss_mask) if m]
            generated = [i for i, m in zip(t.token_ids, t.loss_mask) if m]
            context = t.token_ids[:len(t.token_ids) - len(generated)]
            assert _contains(context, reply)  # the earlier reply, as the engine produced it, as context
            start = t.loss_mask.index(1)  # one reply trains here: its ids are the only ones with loss
            assert t.loss_mask[start:start + len(generated)] == [1] * len(generated) == [1] * sum(t.loss_mask)
            text = tiny_tokenizer.decode(t.token_ids)
            assert text.count("P:") == 2 and before.turn_states[0] in text


def test_stats_count_an_episode_once_however_many_sequences_it_has(tiny_tokenizer):
    windowed = _play(tiny_tokenizer, history_length=0).trajectories
    whole = _play(tiny_tokenizer, history_length=None).trajectories
    assert len(windowed) > len(whole) == 4
    # the same seeds and scripted replies play the same episodes either way
    assert episode_stats(windowed) == pytest.approx(episode_stats(whole))


def test_the_episode_token_budget_counts_every_sequence(tiny_model, tiny_tokenizer):
    # the untrained model fills its 8 new tokens: a budget of 12 in all leaves a second reply 4
    engine = LocalEngine(tiny_model, eos_token_ids=(tiny_tokenizer.eos_token_id,),
                         pad_token_id=tiny_tokenizer.pad_token_id, seed=0)
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=6,
                      budget=TokenBudget(episode_tokens=12), history_length=0)
    result = RolloutCollector.single(lambda: FrozenLakeEnv(map_name=None, max_steps=6), agent,
                                     engine).collect(make_tasks(0, 1, 3, 1))
    assert not result.errors
    for episode in _episodes(result.trajectories):
        assert [t.num_generated for t in episode] == [8, 4]
        assert {t.truncation_reason for t in episode} == {"token_budget"}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_bad_history_length_is_named(tiny_tokenizer, bad):
    with pytest.raises(ConfigError, match="agent.args.history_length"):
        ChatAgent(tiny_tokenizer, SamplingParams(), max_turns=3, history_length=bad)
