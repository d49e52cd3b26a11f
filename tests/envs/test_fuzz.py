"""Hypothesis-fuzzed replies never raise from any built-in env's step.

Parametrized over every env that agentrl's own modules register (`builtin_env_names`), so a new
built-in env is fuzzed without touching this file; a few non-default configurations ride along.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import builtin_env, env_param

from agentrl.envs.checker import builtin_env_names
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.envs.sokoban import SokobanEnv

FACTORIES = {name: builtin_env(name) for name in builtin_env_names()}
FACTORIES["frozen_lake random maps, slippery"] = lambda: FrozenLakeEnv(map_name=None, is_slippery=True)
FACTORIES["sokoban 2 boxes, shaped"] = lambda: SokobanEnv(dim_room=[7, 7], num_boxes=2, max_steps=20,
                                                           progress_reward=1.0)

# Pieces a model might emit, glued together at random: tags, several directions, noise.
PIECES = ["<answer>", "</answer>", "<think>", "</think>", "Up", "down", "LEFT", "right", "u", "R", "←", "↑",
          " ", "\n", "0", "42", "-1", "😀", "İ", "\ud800", "\x00", "<|im_end|>", "answer", "up up", "."]
REPLIES = st.one_of(
    st.text(),  # any unicode, including the empty string and lone surrogates
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=5000),
    st.lists(st.sampled_from(PIECES), max_size=40).map("".join),
    st.builds(lambda piece, n: piece * n, st.sampled_from(PIECES + ["x"]), st.integers(1, 50_000)),
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(result) -> None:
    obs, reward, terminated, truncated, info = result
    assert isinstance(obs, str) and isinstance(info, dict)
    assert isinstance(reward, float) and math.isfinite(reward)
    assert isinstance(terminated, bool) and isinstance(truncated, bool) and not (terminated and truncated)


@pytest.mark.parametrize("name", [env_param(n) for n in FACTORIES])
@FUZZ
@given(reply=REPLIES, seed=st.integers(0, 2**31 - 1))
async def test_any_reply_is_an_ordinary_step(name, reply, seed):
    env = FACTORIES[name]()
    try:
        await env.reset(seed=seed)
        _check(await env.step(reply))
    finally:
        env.close()


@pytest.mark.parametrize("name", [env_param(n) for n in FACTORIES])
@FUZZ
@given(replies=st.lists(REPLIES, min_size=1, max_size=12), seed=st.integers(0, 1000))
async def test_a_whole_episode_of_fuzzed_replies(name, replies, seed):
    env = FACTORIES[name]()
    try:
        await env.reset(seed=seed)
        for reply in replies:
            result = await env.step(reply)
            _check(result)
            if result[2] or result[3]:
                assert isinstance(result[4].get("success"), bool)
                break
    finally:
        env.close()
