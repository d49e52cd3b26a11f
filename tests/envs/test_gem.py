"""GEM's envs through env.type=gem: the contract, GEM's text and rewards, own random numbers, the reference."""

import asyncio
import random
import re

import numpy as np
import pytest

pytest.importorskip("gem", reason="GEM is not installed (pip install 'agentrl[gem]')")

from agentrl.envs.checker import check_env  # noqa: E402
from agentrl.envs.gem import GemEnv, OwnRandom  # noqa: E402
from agentrl.errors import ConfigError, EnvError  # noqa: E402

GUESS = "game:GuessTheNumber-v0-easy"  # 1..10, 4 turns


@pytest.mark.parametrize("env_id", [GUESS, "game:Sokoban-v0-easy"])
def test_gem_games_pass_check_env(env_id):
    assert check_env(lambda: GemEnv(env_id))["episodes"] == 9


def _secret(env: GemEnv) -> int:
    return env._gem.unwrapped.game_number  # GEM's own state: what a perfect player would find


async def test_observation_is_gems_text_and_the_board():
    env = GemEnv("game:Sokoban-v0-easy")
    obs, info = await env.reset(seed=3)
    assert obs.startswith("You are solving the Sokoban puzzle") and "Here is the current board layout:\n# # #" in obs
    assert info == {"seed": 3}
    obs, reward, terminated, truncated, info = await env.step("I push \\boxed{up}")
    assert obs.startswith("At turn 1, you") and "\nHere is the current board layout:\n#" in obs
    assert (reward, terminated, truncated) == (0.0, False, False) and "success" not in info


async def test_a_win_succeeds_and_terminates():
    env = GemEnv(GUESS)
    await env.reset(seed=11)
    obs, reward, terminated, truncated, info = await env.step(f"\\boxed{{{_secret(env)}}}")
    assert obs.startswith("Congratulations") and reward == 1.0
    assert (terminated, truncated, info["success"]) == (True, False, True)
    with pytest.raises(EnvError, match="finished episode"):
        await env.step("\\boxed{1}")


async def test_gems_turn_limit_is_a_truncation_and_a_format_error_ends_the_episode():
    env = GemEnv(GUESS)
    await env.reset(seed=11)
    wrong = [n for n in range(1, 11) if n != _secret(env)]
    for k in range(3):
        assert (await env.step(f"\\boxed{{{wrong[k]}}}"))[2:4] == (False, False)
    obs, reward, terminated, truncated, info = await env.step(f"\\boxed{{{wrong[3]}}}")
    assert "maximum number of turns" in obs and (terminated, truncated, info["success"]) == (False, True, False)
    assert 0.0 < reward < 1.0  # GEM's closeness reward at its turn limit, kept as GEM gives it
    await env.reset(seed=11)
    obs, reward, terminated, truncated, info = await env.step("seven")
    assert (reward, terminated, truncated, info["success"]) == (-0.1, True, False, False)


async def _episode(env, seed, moves):
    out = [await env.reset(seed=seed)]
    for move in moves:
        out.append(await env.step(move))
        if out[-1][2] or out[-1][3]:
            break
    return out


async def test_each_env_owns_its_random_numbers():
    """GEM draws from the global generators; concurrent envs must not share them, nor disturb ours."""
    moves = ["\\boxed{up}", "\\boxed{left}", "\\boxed{down}", "\\boxed{right}"] * 3
    alone = [await _episode(GemEnv("game:Game2048-v0-easy"), s, moves) for s in (1, 2)]  # 2048 draws new tiles
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    together = await asyncio.gather(*(_episode(GemEnv("game:Game2048-v0-easy"), s, moves) for s in (1, 2)))
    assert list(together) == alone
    assert (random.random(), np.random.rand()) == expected


def test_own_random_restores_the_globals_after_an_error():
    own = OwnRandom(1)
    random.seed(2)
    state = random.getstate()
    with pytest.raises(RuntimeError):
        with own.active():
            random.random()
            raise RuntimeError("boom")
    assert random.getstate() == state


def test_sample_action_is_gems_and_seeded_by_the_rng():
    env = GemEnv(GUESS)
    replies = [env.sample_action(random.Random(k)) for k in range(40)]
    assert all(re.fullmatch(r"\\boxed\{([1-9]|10)\}", r) for r in replies) and len(set(replies)) > 5
    assert replies == [env.sample_action(random.Random(k)) for k in range(40)]


class _Played:
    def __init__(self, seed):
        self.env_seed, self.reset_info = seed, {"seed": seed}


def test_the_reference_is_gems_random_policy():
    env = GemEnv(GUESS, baseline_plays=8)
    got = env.eval_baselines([_Played(s) for s in range(16)])
    # Uniform guesses over 1..10 with repeats, 4 tries: 1 - 0.9**4 = 0.34 expected.
    assert set(got) == {"random"} and 0.2 < got["random"] < 0.5
    assert GemEnv(GUESS, baseline_plays=8).eval_baselines([_Played(s) for s in range(16)]) == got


def test_bad_arguments_are_one_line():
    with pytest.raises(ConfigError, match="not in GEM's registry. Did you mean 'game:Sokoban-v0-easy'"):
        GemEnv("game:Sokobn-v0-easy")
    with pytest.raises(ConfigError, match="kwargs"):
        GemEnv(GUESS, kwargs=[1])


async def test_reward_success_pays_only_a_win():
    env = GemEnv(GUESS, reward="success")
    await env.reset(seed=11)
    wrong = [n for n in range(1, 11) if n != _secret(env)]
    rewards = [(await env.step(f"\\boxed{{{n}}}"))[1] for n in wrong[:4]]
    assert rewards == [0.0, 0.0, 0.0, 0.0]  # GEM pays the last of these its closeness reward (above)
    await env.reset(seed=11)
    assert (await env.step("seven"))[1] == -0.1  # GEM's format error: a penalty, kept
    await env.reset(seed=11)
    await env.step(f"\\boxed{{{wrong[0]}}}")
    obs, reward, terminated, _, info = await env.step(f"\\boxed{{{_secret(env)}}}")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    with pytest.raises(ConfigError, match=r"reward='win' is invalid; reward must be 'gem' .* or 'success'"):
        GemEnv(GUESS, reward="win")
