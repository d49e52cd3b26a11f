"""Warm-start demonstrations: every reply is a uniformly random valid move of its own episode."""

import math
import re

import pytest

from agentrl.agents.chat import ChatAgent
from agentrl.envs.frozen_lake import ACTION_NAMES, FrozenLakeEnv, parse_action
from agentrl.llm.engine import SamplingParams
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.tasks import make_tasks
from agentrl.rollout.demos import ScriptedClient


def _replies(traj, tokenizer):
    """The text of each generated span (decoded only to check it, never to train on)."""
    spans, start = [], None
    for i, m in enumerate(traj.loss_mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append(tokenizer.decode(traj.token_ids[start:i], skip_special_tokens=True))
            start = None
    return spans


def _on_board(observation):
    row, col = map(int, re.search(r"P: row (\d+), column (\d+)\.", observation).groups())
    keep = (col > 1, row < 4, col < 4, row > 1)  # Left, Down, Right, Up on a 4x4 board (1-based)
    return {i for i, k in enumerate(keep) if k}


def test_demo_replies_follow_each_episodes_own_state(tiny_tokenizer):
    client = ScriptedClient(tiny_tokenizer, lambda: FrozenLakeEnv(map_name="4x4"))
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=6)
    collector = RolloutCollector.single(client.env_factory, agent, client)
    client.reset_entropy()
    trajs = collector.collect(make_tasks(0, 0, 12, 1)).trajectories  # 12 episodes at once
    assert len(trajs) == 12
    expected, moves = 0.0, set()
    for traj in trajs:
        replies = _replies(traj, tiny_tokenizer)
        assert len(replies) == len(traj.turn_states) > 0
        for observation, reply in zip(traj.turn_states, replies):
            valid = _on_board(observation)
            assert parse_action(reply) in valid, (observation, reply)
            moves.add(parse_action(reply))
            expected += math.log(len(valid))
    assert moves == set(range(len(ACTION_NAMES)))  # random, not one fixed move
    assert client.reply_entropy == pytest.approx(expected)


def test_an_env_that_demonstrates_is_demonstrated_without_tools(tiny_tokenizer):
    # MiniGrid's BabyAI levels demonstrate with the scripted bot: a chat agent (no tools) is shown
    # the bot's actions, so the demonstrations solve what the bot solves, not a random policy's 0.04.
    from agentrl.envs.minigrid import MiniGridTextEnv

    def make():
        return MiniGridTextEnv("BabyAI-GoToObj-v0", {"max_steps": 12})

    client = ScriptedClient(tiny_tokenizer, make)
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=12)
    trajs = RolloutCollector.single(client.env_factory, agent, client).collect(make_tasks(0, 0, 8, 1)).trajectories
    solved = sum(t.success for t in trajs) / len(trajs)
    assert solved == make().eval_baselines(trajs)["bot"] > 0.5
