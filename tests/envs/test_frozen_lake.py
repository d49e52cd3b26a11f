"""FrozenLake text env: Gymnasium dynamics, parsing, episode ends, value iteration, baselines."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS, generate_random_map
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.envs.frozen_lake import (
    goal_distances,
    ACTION_NAMES,
    FrozenLakeEnv,
    best_blind_success,
    optimal_success,
    parse_action,
    render_board,
)
from agentrl.errors import ConfigError, EnvError
from agentrl.registry import ENVS


def lake(desc, slippery=False):
    """Gymnasium's own lake for `desc` (the reference for our env)."""
    return gym.make("FrozenLake-v1", desc=desc, is_slippery=slippery).unwrapped


def blind_score(descs, seq):
    """Fraction of deterministic maps that `seq` solves, replayed one map at a time."""
    solved = 0
    for desc in descs:
        env = lake(desc)
        env.reset(seed=0)
        for a in seq:
            _, r, term, _, _ = env.step(a)
            if term:
                solved += r > 0
                break
    return solved / len(descs)


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


# --- value iteration -------------------------------------------------------------------------


def test_optimal_success_default_map():
    P = lake(MAPS["4x4"]).P
    assert optimal_success(P, 16, horizon=6) == pytest.approx(1.0)
    assert optimal_success(P, 16, horizon=5) == 0.0


def test_optimal_success_slippery_and_blocked():
    assert 0.7 < optimal_success(lake(MAPS["4x4"], slippery=True).P, 16, horizon=100) < 0.83
    blocked = ["SFH", "FHF", "HFG"]
    assert optimal_success(lake(blocked).P, 9, horizon=50) == 0.0
    assert optimal_success(lake(blocked, slippery=True).P, 9, horizon=50) == 0.0


async def test_reset_reports_optimal_for_horizon():
    _, info = await FrozenLakeEnv(max_steps=5).reset(seed=0)
    assert info["optimal_success"] == 0.0
    _, info = await FrozenLakeEnv(max_steps=6).reset(seed=0)
    assert info["optimal_success"] == 1.0


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


async def test_sample_action_on_slippery_ice_tries_the_edge_and_keeps_out_of_holes():
    # on ice a move into the edge slides along it (the optimum's move on 5 cells of the 4x4 map):
    # demonstrations that never try it leave the policy no way to learn it; a move that heads
    # into a hole breaks the rules the instructions state
    env = FrozenLakeEnv(is_slippery=True, progress_reward=0.0)
    await env.reset(seed=0)
    rng = random.Random(0)
    assert {parse_action(env.sample_action(rng)) for _ in range(100)} == {0, 1, 2, 3}  # the corner
    env._gym.unwrapped.s = env._pos = 1  # top edge, a hole below: Left, Right, Up (the edge)
    assert {parse_action(env.sample_action(rng)) for _ in range(100)} == {0, 2, 3}
    env._gym.unwrapped.s = env._pos = 6  # holes left and right
    assert {parse_action(env.sample_action(rng)) for _ in range(100)} == {1, 3}


# --- map-blind baseline ----------------------------------------------------------------------


def test_best_blind_single_map():
    score, seq = best_blind_success([MAPS["4x4"]], horizon=6)
    assert score == 1.0 and len(seq) == 6
    assert blind_score([MAPS["4x4"]], seq) == 1.0


def test_best_blind_random_maps():
    descs = [generate_random_map(size=4, p=0.8, seed=s) for s in range(64)]
    score, seq = best_blind_success(descs, horizon=6)
    assert 0.3 < score < 0.6
    assert blind_score(descs, seq) == pytest.approx(score)
    # exhaustive: no sequence from a few obvious families beats it
    for other in ([2, 2, 2, 1, 1, 1], [1, 1, 1, 2, 2, 2], [2, 1, 2, 1, 2, 1], [1, 2, 1, 2, 1, 2]):
        assert blind_score(descs, other) <= score


def test_best_blind_matches_brute_force_small():
    import itertools

    descs = [generate_random_map(size=3, p=0.7, seed=s) for s in range(12)]
    brute = max(blind_score(descs, s) for s in itertools.product(range(4), repeat=4))
    score, seq = best_blind_success(descs, horizon=4)
    assert score == pytest.approx(brute) and blind_score(descs, seq) == pytest.approx(score)


def test_best_blind_counts_a_repeated_map_by_its_episodes():
    """An eval that plays one map many times (the fixed map) scores as the episodes' mean, with
    each distinct map searched once (256 copies used to hold 256 copies of every belief)."""
    import itertools

    descs = [generate_random_map(size=3, p=0.7, seed=s) for s in range(3)]
    repeated = [descs[0]] * 5 + [descs[1]] * 2 + [descs[2]]
    brute = max(blind_score(repeated, s) for s in itertools.product(range(4), repeat=4))
    score, seq = best_blind_success(repeated, horizon=4)
    assert score == pytest.approx(brute) and blind_score(repeated, seq) == pytest.approx(score)
    slippery = [MAPS["4x4"]] * 256
    assert best_blind_success(slippery, horizon=6, is_slippery=True)[0] == pytest.approx(
        best_blind_success([MAPS["4x4"]], horizon=6, is_slippery=True)[0])


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


def test_map_blind_baseline_from_eval_trajectories():
    from types import SimpleNamespace

    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    maps = [generate_random_map(size=4, p=0.8, seed=s) for s in range(32)]
    trajs = [SimpleNamespace(reset_info={"map": "/".join(m)}, num_turns=6) for m in maps]
    out = FrozenLakeEnv(map_name=None, max_steps=6).eval_baselines(trajs)
    assert out["map_blind"] == pytest.approx(best_blind_success(maps, 6)[0])
    assert 0.2 < out["map_blind"] < 0.7


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


async def test_slippery_optimum_for_the_horizon_is_what_its_optimal_policy_reaches():
    """The reported optimum is reached by acting on value iteration's time-dependent policy in the env."""
    import numpy as np

    from agentrl.envs.frozen_lake import _tables

    horizon = 12
    env = FrozenLakeEnv(is_slippery=True, max_steps=horizon)
    _, info = await env.reset(seed=0)
    goal, cont = _tables(env._gym.unwrapped.P, 16)
    values, policy = [np.zeros(16)], []
    for _ in range(horizon):  # policy[k]: the best action with k + 1 steps left
        q = goal + cont @ values[-1]
        policy.append(q.argmax(axis=0))
        values.append(q.max(axis=0))
    assert info["optimal_success"] == pytest.approx(values[-1][0])
    wins, episodes = 0, 1000
    for seed in range(episodes):
        await env.reset(seed=seed)
        for left in range(horizon, 0, -1):
            _, _, terminated, truncated, step = await env.step(ACTION_NAMES[policy[left - 1][env.position]])
            if terminated or truncated:
                wins += step["success"]
                break
    assert abs(wins / episodes - info["optimal_success"]) < 0.025  # 1000 seeded episodes at p = 0.07: 3 standard errors
