"""wait_walk: a wait adds a step and changes nothing else; a direction ends the episode."""

import asyncio
import random

import pytest

from agentrl.envs.checker import check_env
from agentrl.envs.wait_walk import WaitWalkEnv
from agentrl.errors import ConfigError


def _play(env, seed, replies):
    async def go():
        obs, info = await env.reset(seed=seed)
        steps = [(obs, info)]
        for reply in replies:
            steps.append(await env.step(reply))
        return steps
    return asyncio.run(go())


def test_passes_the_env_checker():
    check_env(lambda: WaitWalkEnv(max_steps=4))


def test_waiting_leaves_the_state_and_what_can_be_earned_as_they_were():
    env = WaitWalkEnv(max_steps=6)
    first, *waits, last = _play(env, 3, ["<answer>Wait</answer>"] * 3 + ["<answer>Left</answer>"])
    goal = first[0].split()[-1].rstrip(".")
    assert all(obs == first[0] and reward == 0.0 and not (term or trunc) for obs, reward, term, trunc, _ in waits)
    _, reward, terminated, truncated, info = last
    assert terminated and not truncated and info["success"] == (goal == "Left") and reward == float(goal == "Left")
    assert info["metrics"] == {"waits": 3, "wait_share": 0.75}


def test_the_last_step_says_so_and_a_wait_there_ends_the_episode_empty_handed():
    env = WaitWalkEnv(max_steps=2)
    (obs0, _), (obs1, r1, *_), (obs2, r2, terminated, truncated, info) = _play(env, 0, ["wait", "Wait."])
    assert "Last step" not in obs0 and "Last step" in obs1
    assert (r1, r2, terminated, truncated, info["success"]) == (0.0, 0.0, False, True, False)
    assert info["metrics"] == {"waits": 2, "wait_share": 1.0}


def test_demonstrations_never_wait_on_the_last_step():
    env = WaitWalkEnv(max_steps=2)
    _play(env, 0, ["<answer>Wait</answer>"])
    assert {env.sample_action(random.Random(i)) for i in range(50)} == {"<answer>Left</answer>", "<answer>Right</answer>"}


def test_a_bad_argument_is_named():
    with pytest.raises(ConfigError, match=r"wait_walk: max_steps=0 is invalid; max_steps must be an int from 1"):
        WaitWalkEnv(max_steps=0)
