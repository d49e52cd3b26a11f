"""TextArena's games through env.type=textarena: the contract, TextArena's text and rewards, own random
numbers, the references, and games of more than two players refused (two-player games:
test_textarena_games.py)."""

import asyncio
import random
import re

import numpy as np
import pytest

ta = pytest.importorskip("textarena", reason="TextArena is not installed (pip install 'agentrl[textarena]')")

from agentrl.envs.checker import check_env  # noqa: E402
from agentrl.envs.textarena import TextArenaEnv, unwrapped  # noqa: E402
from agentrl.errors import ConfigError, EnvError  # noqa: E402

GUESS = "GuessTheNumber-v0"  # 1..20, 10 guesses


@pytest.mark.parametrize("game", [GUESS, "FrozenLake-v0", "TowerOfHanoi-v0", "Minesweeper-v0-small", "LightsOut-v0"])
def test_textarena_games_pass_check_env(game):
    assert check_env(lambda: TextArenaEnv(game))["episodes"] == 9


def _secret(env: TextArenaEnv) -> int:
    return unwrapped(env._env).game_number  # TextArena's own state: what a perfect player would find


async def _ours(game, seed, moves):
    env, out = TextArenaEnv(game), []
    obs, _ = await env.reset(seed=seed)
    out.append(obs)
    for move in moves:
        obs, reward, terminated, truncated, info = await env.step(move)
        out.append(obs)
        if terminated or truncated:
            return out, reward, info
    return out, None, {}


def _theirs(game, seed, moves):
    """TextArena driven directly, as its own examples do: make, reset, step until done, close."""
    env = ta.make(game)
    env.reset(num_players=1, seed=seed)
    _, text = env.get_observation()
    for move in moves:
        done, _ = env.step(move)
        _, text = env.get_observation()
        if done:
            rewards, game_info = env.close()
            return text, rewards[0], game_info[0]
    return text, None, {}


@pytest.mark.parametrize("game,seed,moves", [
    (GUESS, 4, ["[10]", "[15]", "[12]", "[3]", "[1]", "[2]", "[4]", "[5]", "[6]", "[7]", "[8]"]),
    (GUESS, 4, ["[10]", "[10]", "seven"]),  # a repeat, then an unreadable guess: two invalid moves in a row
    ("FrozenLake-v0", 2, ["[down]", "[down]", "[right]", "[right]", "[down]", "[right]", "[up]"] * 3),
    ("TowerOfHanoi-v0", 0, ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]),
    ("Minesweeper-v0-small", 7, [f"[{r} {c}]" for r in range(5) for c in range(5)]),
])
async def test_text_and_rewards_are_textareanas_own(game, seed, moves):
    ours, reward, info = await _ours(game, seed, moves)
    text, their_reward, their_info = _theirs(game, seed, moves)
    assert reward is not None and reward == their_reward
    assert info["success"] == (their_reward >= 1.0) and info["reason"] == their_info["reason"]
    assert info["metrics"]["invalid_move"] == float(their_info["invalid_move"])
    # TextArena's log for player 0, shown a new piece at a time, then the game's reason
    assert "\n".join(ours) == f"{text.lstrip()}\n{their_info['reason']}"


async def test_a_win_succeeds_and_terminates():
    env = TextArenaEnv(GUESS)
    obs, info = await env.reset(seed=11)
    assert obs.startswith("[GAME] You are Player 0. You are playing Guess The Number.") and info == {"seed": 11}
    obs, reward, terminated, truncated, info = await env.step(str(_secret(env)))  # TextArena brackets a bare number
    assert obs.endswith("Congratulations! You guessed the correct number.") and reward == 1.0
    assert (terminated, truncated, info["success"]) == (True, False, True)
    with pytest.raises(EnvError, match="finished episode"):
        await env.step("[1]")


async def test_a_reply_the_game_itself_cannot_read_is_an_invalid_move():
    """Found by the fuzz test: Guess the Number raises on `int()` of a bracketed 4,301-digit number
    (Python's digit limit); the reply is then the game's invalid move, twice in a row the end."""
    env = TextArenaEnv(game="GuessTheNumber-v0")
    await env.reset(seed=0)
    huge = "[" + "0" * 4301 + "]"
    obs, reward, terminated, truncated, _ = await env.step(huge)
    assert not terminated and "invalid move" in obs
    obs, reward, terminated, truncated, info = await env.step(huge)
    assert terminated and not truncated and info["success"] is False and info["metrics"]["invalid_move"] == 1.0


async def test_each_env_owns_its_random_numbers():
    """TextArena seeds and draws from the global generator; concurrent envs must not share it, nor disturb ours."""
    moves = ["[up]", "[down]", "[left]", "[right]"] * 3
    alone = [await _ours("Minesweeper-v0-small", s, [f"[{k} {k}]" for k in range(5)]) for s in (1, 2)]
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    together = await asyncio.gather(*(_ours("Minesweeper-v0-small", s, [f"[{k} {k}]" for k in range(5)])
                                      for s in (1, 2)), _ours("FrozenLake-v0-random", 3, moves))
    assert list(together[:2]) == alone
    assert (random.random(), np.random.rand()) == expected
    env = TextArenaEnv(GUESS)
    secrets = set()
    for seed in (1, 2, 1):
        await env.reset(seed=seed)
        secrets.add((seed, _secret(env)))
    assert len(secrets) == 2  # the same seed replays the same secret on a reused env


async def test_sample_action_is_a_valid_move_drawn_from_the_rng():
    env = TextArenaEnv(GUESS)
    await env.reset(seed=3)
    await env.step("[10]")
    replies = [env.sample_action(random.Random(k)) for k in range(60)]
    assert all(re.fullmatch(r"\[([1-9]|1[0-9]|20)\]", r) for r in replies) and "[10]" not in replies
    assert len(set(replies)) > 8 and replies == [env.sample_action(random.Random(k)) for k in range(60)]
    lake = TextArenaEnv("FrozenLake-v0")
    await lake.reset(seed=0)  # the top-left corner: two moves stay on the grid
    assert {lake.sample_action(random.Random(k)) for k in range(40)} == {"[down]", "[right]"}
    mastermind = TextArenaEnv("Mastermind-v0")  # a game without a move list here: the text's bracketed moves
    await mastermind.reset(seed=0)
    replies = [mastermind.sample_action(random.Random(k)) for k in range(20)]
    assert all(r.startswith("[") and r.endswith("]") for r in replies)


class _Played:
    def __init__(self, seed):
        self.env_seed, self.reset_info = seed, {"seed": seed}


def test_the_references_are_a_random_policy_and_binary_search():
    env = TextArenaEnv(GUESS, baseline_plays=4)
    got = env.eval_baselines([_Played(s) for s in range(32)])
    # Random unguessed numbers in 1..20, 10 guesses: 10/20 = 0.5 expected; bisection wins every game.
    assert set(got) == {"random", "bisect"} and 0.35 < got["random"] < 0.65 and got["bisect"] == 1.0
    assert TextArenaEnv(GUESS, baseline_plays=4).eval_baselines([_Played(s) for s in range(32)]) == got
    assert set(TextArenaEnv("FrozenLake-v0").eval_baselines([_Played(s) for s in range(4)])) == {"random"}


def test_bad_arguments_are_one_line():
    with pytest.raises(ConfigError, match="not in TextArena's registry. Did you mean 'GuessTheNumber-v0'") as e:
        TextArenaEnv("GuessTheNumbr-v0")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"textarena: kwargs=\[1\] is invalid"):
        TextArenaEnv(GUESS, kwargs=[1])
    with pytest.raises(ConfigError, match=r"make\('GuessTheNumber-v0', \*\*\{'colour': 1\}\) failed: TypeError"):
        TextArenaEnv(GUESS, kwargs={"colour": 1})
    with pytest.raises(ConfigError, match="baseline_plays"):
        TextArenaEnv(GUESS, baseline_plays=0)


def test_a_two_player_game_has_roles_and_a_single_player_game_none():
    assert TextArenaEnv("TicTacToe-v0").roles == ("player_0", "player_1") and TextArenaEnv(GUESS).roles == ()


@pytest.mark.parametrize("game,why", [
    ("Snake-v0", "its state is a FFAMultiPlayerState, not a TwoPlayerState"),  # 2 to 15 players
    ("PublicGoodsGame-v0", "its state is a FFAMultiPlayerState"),
    ("ThreePlayerTicTacToe-v0", "neither a one- nor a two-player game .*only works with exactly three players"),
])
def test_games_of_more_than_two_players_are_refused_in_one_line(game, why):
    with pytest.raises(ConfigError, match=f"{why}.*agentrl plays TextArena's single-player games and its two") as e:
        TextArenaEnv(game)
    assert "\n" not in str(e.value)
