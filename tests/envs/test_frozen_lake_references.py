"""FrozenLake's references: the optimum for the horizon (value iteration) and the best map-blind
move sequence, against Gymnasium's own dynamics."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS, generate_random_map

from agentrl.envs.frozen_lake import ACTION_NAMES, FrozenLakeEnv, best_blind_success, optimal_success


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


def test_map_blind_baseline_from_eval_trajectories():
    from types import SimpleNamespace

    maps = [generate_random_map(size=4, p=0.8, seed=s) for s in range(32)]
    trajs = [SimpleNamespace(reset_info={"map": "/".join(m)}, num_turns=6) for m in maps]
    out = FrozenLakeEnv(map_name=None, max_steps=6).eval_baselines(trajs)
    assert out["map_blind"] == pytest.approx(best_blind_success(maps, 6)[0])
    assert 0.2 < out["map_blind"] < 0.7
