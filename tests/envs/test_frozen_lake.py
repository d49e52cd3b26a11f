"""FrozenLake text env: Gymnasium dynamics, parsing, episode ends, demonstrations, config checks
(its references, optimum and map-blind baseline: test_frozen_lake_references.py)."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest
from gymnasium.envs.toy_text.frozen_lake import generate_random_map
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.envs.frozen_lake import (
    goal_distances,
    ACTION_NAMES,
    FrozenLakeEnv,
    parse_action,
    render_board,
)
from agentrl.errors import ConfigError, EnvError
from agentrl.registry import ENVS


# --- rendering -------------------------------------------------------------------------------


async def test_default_board_text_and_info():
    env = FrozenLakeEnv(progress_reward=0.0)
    obs, info = await env.reset(seed=0)
    assert obs == "P _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G\nP: row 1, column 1."
    assert info == {"optimal_success": 1.0, "map": "SFFF/FHFH/FFFH/HFFG"}
    assert "<answer>" in env.instructions and "Left" in env.instructions


def test_render_shows_player_on_goal_and_hole():
    desc = ["SH", "FG"]
    assert render_board(desc, 0) == "P O\n_ G"
    assert render_board(desc, 1) == "_ P\n_ G"
    assert render_board(desc, 3) == "_ O\n_ P"


def test_registered():
    assert ENVS.get("frozen_lake") is FrozenLakeEnv


# --- transitions agree with Gymnasium -------------------------------------------------------


@pytest.mark.parametrize("slippery", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
async def test_lockstep_with_gymnasium(seed, slippery):
    env = FrozenLakeEnv(map_name=None, size=5, is_slippery=slippery, max_steps=30, progress_reward=0.0)
    _, info = await env.reset(seed=seed)
    desc = info["map"].split("/")
    assert desc == generate_random_map(size=5, p=0.8, seed=seed)
    ref = gym.make("FrozenLake-v1", desc=desc, is_slippery=slippery)
    ref_pos, _ = ref.reset(seed=seed)
    rng = random.Random(seed)
    for _ in range(30):
        a = rng.randrange(4)
        obs, reward, term, trunc, step_info = await env.step(f"<answer>{ACTION_NAMES[a]}</answer>")
        ref_pos, ref_reward, ref_term, _, _ = ref.step(a)
        assert env.position == ref_pos
        assert obs.split("\nP: ")[0] == render_board(desc, ref_pos)
        assert obs.endswith(f"P: row {ref_pos // len(desc) + 1}, column {ref_pos % len(desc) + 1}.")
        assert reward == float(ref_reward)  # default rewards equal Gymnasium's (1, 0, 0)
        assert term == ref_term
        assert step_info["action"] == ACTION_NAMES[a]
        if term or trunc:
            break


async def test_slippery_same_seed_same_trajectory():
    async def run(seed):
        env = FrozenLakeEnv(map_name="8x8", is_slippery=True, max_steps=40)
        await env.reset(seed=seed)
        path = []
        for i in range(40):
            _, _, term, trunc, _ = await env.step(ACTION_NAMES[i % 4])
            path.append(env.position)
            if term or trunc:
                break
        return path

    assert await run(7) == await run(7)
    assert len({tuple(await run(s)) for s in range(6)}) > 1


# --- random maps -----------------------------------------------------------------------------


async def test_random_maps_reproducible_distinct_solvable():
    env = FrozenLakeEnv(map_name=None, size=4, max_steps=16)
    maps = []
    for seed in range(20):
        obs, info = await env.reset(seed=seed)
        obs2, info2 = await env.reset(seed=seed)
        assert (obs, info) == (obs2, info2)
        assert info["optimal_success"] == 1.0  # horizon size*size: every solvable map is solved
        maps.append(info["map"])
    assert len(set(maps)) >= 15
    _, a = await env.reset()
    _, b = await env.reset()
    _, c = await env.reset()
    assert len({a["map"], b["map"], c["map"]}) > 1  # seed None draws fresh maps


# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Left", 0),
        ("<answer>left</answer>", 0),
        ("I go <answer>RIGHT</answer>", 2),
        ("u", 3),
        (" D ", 1),
        ("↓", 1),
        ("<answer>→</answer>", 2),
        ("up up and away", 3),
        ("left or right", None),
        ("", None),
        ("asdf qwe", None),
        ("lefty setup", None),
        ("<answer>Down</answer> later <answer>Up</answer>", 3),
        ("maybe left or right... <answer>Down</answer>", 1),
        ("<answer>Left", 0),
        ("<answer></answer>", None),
        ("L R", None),
    ],
)
def test_parse_action(reply, expected):
    assert parse_action(reply) == expected


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_action_never_raises(reply):
    assert parse_action(reply) in (None, 0, 1, 2, 3)


@pytest.mark.parametrize(
    "reply",
    ["x" * 1_000_000, "<answer>" * 200_000, "</answer>" * 100_000, "left " * 200_000 + "right",
     "\x00\x01\x1b[31m\r\n\t", "İ" * 100_000 + "<answer>Up</answer>", "\ud800"],
)
async def test_any_reply_is_a_step(reply):
    env = FrozenLakeEnv(progress_reward=0.0)
    obs, _ = await env.reset(seed=0)
    out, reward, term, trunc, info = await env.step(reply)
    if not info["action_valid"]:
        assert (out, reward, term, trunc) == (obs, -0.1, False, False)
        assert info["action"] is None and env.position == 0


async def test_huge_answer_content_is_parsed_quickly():
    assert parse_action("<answer>Up</answer>" + "z" * 1_000_000) == 3
    assert parse_action("<answer>" + " " * 5000 + "Up</answer>") is None  # beyond the scan cap


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
async def test_invalid_reply_keeps_state(reply):
    env = FrozenLakeEnv(format_penalty=-0.5, progress_reward=0.0)
    obs, _ = await env.reset(seed=0)
    await env.step("Right")
    out, reward, term, trunc, info = await env.step(reply)
    if parse_action(reply) is None:
        assert out == "_ P _ _\n_ O _ O\n_ _ _ O\nO _ _ G\nP: row 1, column 2." and reward == -0.5
        assert info["action_valid"] is False and info["action"] is None
        assert not term and not trunc
    else:
        assert info["action_valid"] is True


# --- episode end -----------------------------------------------------------------------------


async def test_reaching_goal():
    env = FrozenLakeEnv(step_reward=-0.01, progress_reward=0.0)
    await env.reset(seed=0)
    rewards = []
    for move in ["Down", "Down", "Right", "Down", "Right"]:
        _, r, term, trunc, info = await env.step(move)
        rewards.append(r)
        assert not term and not trunc and "success" not in info
    obs, r, term, trunc, info = await env.step("<answer>Right</answer>")
    assert rewards == [-0.01] * 5
    assert (r, term, trunc, info["success"]) == (1.0, True, False, True)
    assert obs.endswith("O _ _ P\nP: row 4, column 4.")
    with pytest.raises(EnvError):
        await env.step("Left")


async def test_falling_in_hole():
    env = FrozenLakeEnv(hole_reward=-1.0, progress_reward=0.0)
    await env.reset(seed=0)
    await env.step("Down")
    obs, r, term, trunc, info = await env.step("Right")
    assert (r, term, trunc, info["success"]) == (-1.0, True, False, False)
    assert obs.split("\n")[1] == "_ P _ O"
    with pytest.raises(EnvError):
        await env.step("Right")


async def test_max_steps_truncates_counting_invalid_replies():
    env = FrozenLakeEnv(max_steps=3, progress_reward=0.0)
    await env.reset(seed=0)
    assert (await env.step("Left"))[3] is False
    assert (await env.step("nonsense"))[3] is False
    _, r, term, trunc, info = await env.step("??")
    assert (r, term, trunc, info["success"], info["action_valid"]) == (-0.1, False, True, False, False)
    with pytest.raises(EnvError):
        await env.step("Down")
    await env.reset(seed=0)  # a new episode may start
    assert (await env.step("Down"))[1] == 0.0


async def test_step_before_reset_raises():
    with pytest.raises(EnvError):
        await FrozenLakeEnv().step("Down")


def test_sample_action():
    env = FrozenLakeEnv(progress_reward=0.0)
    rng = random.Random(0)
    samples = [env.sample_action(rng) for _ in range(200)]
    assert {parse_action(s) for s in samples} == {0, 1, 2, 3}
    assert all(s.startswith("<answer>") and s.endswith("</answer>") for s in samples)


async def test_sample_action_keeps_to_the_board():
    # demonstrations draw among the moves that stay on the board: from the corner only two
    env = FrozenLakeEnv(progress_reward=0.0)
    await env.reset(seed=0)
    rng = random.Random(0)
    assert {parse_action(env.sample_action(rng)) for _ in range(100)} == {1, 2}  # Down, Right
    await env.step("Right")  # top edge, column 2: Left, Down, Right
    assert {parse_action(env.sample_action(rng)) for _ in range(100)} == {0, 1, 2}


async def test_sample_action_on_slippery_ice_draws_the_moves_that_cannot_slide_into_a_hole():
    # a move on ice goes its way or to either side, never back: demonstrations keep to the moves
    # none of whose three outcomes is a hole, or, where every move risks one, the least risky
    env = FrozenLakeEnv(is_slippery=True, progress_reward=0.0)
    await env.reset(seed=0)
    rng = random.Random(0)

    def drawn(cell):
        env._gym.unwrapped.s = env._pos = cell
        return {parse_action(env.sample_action(rng)) for _ in range(100)}

    assert drawn(0) == {0, 1, 2, 3}  # the corner: no hole next to it
    assert drawn(1) == {3}  # a hole below: Left and Right may slide down into it, Up slides along the edge
    assert drawn(4) == {0}  # a hole to the right: Left, which slides up or down at worst
    assert drawn(6) == {0, 2}  # holes left and right: Left or Right risk one, Down or Up risk both
    assert drawn(14) == {0, 1, 2, 3}  # next to the goal, no hole: anything


# --- config validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"size": 1}, "size"),
        ({"size": "4"}, "size"),
        ({"size": True}, "size"),
        ({"map_name": "5x5"}, "map_name"),
        ({"frozen_prob": 0.1}, "frozen_prob"),
        ({"frozen_prob": 1.5}, "frozen_prob"),
        ({"is_slippery": "yes"}, "is_slippery"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_steps": 2.5}, "max_steps"),
        ({"success_reward": "1"}, "success_reward"),
        ({"step_reward": float("nan")}, "step_reward"),
        ({"hole_reward": None}, "hole_reward"),
        ({"format_penalty": float("inf")}, "format_penalty"),
    ],
)
def test_bad_args(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        FrozenLakeEnv(**kwargs)


async def test_progress_shaping_sums_to_fraction_of_way_and_is_kept_in_a_hole():
    env = FrozenLakeEnv(progress_reward=0.5)  # default 4x4: shortest path 6 (Down, Down, Right, Down, Right, Right)
    await env.reset(seed=0)
    total = 0.0
    for move in ["Down", "Down", "Right"]:
        _, r, *_ = await env.step(move)
        total += r
    assert total == pytest.approx(0.5 * 3 / 6)
    _, r, term, _, info = await env.step("Up")  # (1,1) is a hole: the episode ends, progress kept
    assert term and not info["success"]
    assert r == 0.0 and total + r == pytest.approx(0.5 * 3 / 6)
    await env.reset(seed=0)
    rewards = [(await env.step(m))[1] for m in ["Down", "Down", "Right", "Down", "Right", "Right"]]
    assert sum(rewards) == pytest.approx(1.0 + 0.5)


def test_goal_distances_bfs():
    d = goal_distances(["SFFF", "FHFH", "FFFH", "HFFG"])
    assert d[0] == 6 and d[15] == 0 and d[14] == 1 and d[5] == 16  # holes are unreachable


async def test_position_line_can_be_turned_off():
    obs, _ = await FrozenLakeEnv(show_position=False).reset(seed=0)
    assert obs == "P _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G"
    env = FrozenLakeEnv()
    await env.reset(seed=0)
    obs, *_ = await env.step("Down")
    assert obs.endswith("P: row 2, column 1.")


async def test_neighbour_line_names_the_cells_beside_p():
    env = FrozenLakeEnv(show_neighbours=True)
    obs, _ = await env.reset(seed=0)
    assert obs.endswith("P: row 1, column 1.\nNext to P: Left #, Down _, Right _, Up #.")
    obs, *_ = await env.step("Down")
    assert obs.endswith("Next to P: Left #, Down _, Right O, Up _.")  # the 4x4 map's hole at row 2, column 2
    assert "# is off the board" in env.instructions
    assert "Next to P" not in (await FrozenLakeEnv().reset(seed=0))[0]
