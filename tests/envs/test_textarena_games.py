"""TextArena's two-player games through env.type=textarena: roles that alternate, each player's own new text,
zero-sum rewards, invalid moves, legal random moves, scripted demonstrations that beat random, references."""

import random

import pytest

ta = pytest.importorskip("textarena", reason="TextArena is not installed (pip install 'agentrl[textarena]')")

from agentrl.envs.checker import check_env  # noqa: E402
from agentrl.envs.textarena import TextArenaEnv, win_rates  # noqa: E402
from agentrl.envs.textarena_games import available_moves  # noqa: E402

TTT, NIM, KUHN = "TicTacToe-v0", "Nim-v0", "KuhnPoker-v0"


async def _play(env, seed, moves):
    """Our env on `moves`: [(role to act, observation)], then the last step's (reward, info)."""
    obs, info = await env.reset(seed=seed)
    seen = [(info["role"], obs)]
    for move in moves:
        obs, reward, terminated, _, info = await env.step(move)
        if terminated:
            return seen, obs, reward, info
        seen.append((info["role"], obs))
    return seen, None, None, info


def _their_texts(game, seed, moves):
    """TextArena driven directly: the last whole text each player was shown, by player id."""
    env = ta.make(game)
    env.reset(num_players=2, seed=seed)
    texts = dict([env.get_observation()])
    for move in moves:
        done, _ = env.step(move)
        texts.update([env.get_observation()])
        if done:
            break
    return texts


async def test_roles_alternate_and_each_player_is_shown_only_its_new_text():
    moves = ["[4]", "[0]", "[8]", "[2]", "[6]", "[1]"]  # player 1 (X) completes 0-1-2 on the last move
    env = TextArenaEnv(TTT)
    seen, last, reward, info = await _play(env, 0, moves)
    assert [role for role, _ in seen] == ["player_0", "player_1"] * 3
    assert "You are Player 1" in seen[1][1] and "Player 0 placed their symbol (O) in cell 4." in seen[1][1]
    assert "Player 1 placed their symbol (X) in cell 0." in seen[2][1] and "You are Player 0" not in seen[2][1]
    # each player's observations, joined, are TextArena's own text for that player: nothing shown twice
    theirs = _their_texts(TTT, 0, moves)
    for player, role in enumerate(env.roles):
        ours = [obs for r, obs in seen if r == role] + ([last.removesuffix("\nPlayer 1 has won!")] if player else [])
        assert "\n".join(ours) == theirs[player].lstrip("\n")
    assert last.endswith("Player 1 has won!") and "role" not in info
    assert (reward, info["rewards"], info["success"]) == (1.0, {"player_0": -1.0, "player_1": 1.0}, True)
    assert info["metrics"] == {"invalid_move": 0.0} and info["reason"] == "Player 1 has won!"


async def test_a_draw_pays_nothing():
    _, _, reward, info = await _play(TextArenaEnv(TTT), 0, [f"[{c}]" for c in (4, 0, 8, 2, 1, 7, 3, 5, 6)])
    assert (reward, info["rewards"], info["success"]) == (0.0, {"player_0": 0.0, "player_1": 0.0}, False)


async def test_the_same_seed_deals_the_same_cards():
    async def deal(seed):
        env = TextArenaEnv(KUHN)
        seen, last, reward, info = await _play(env, seed, ["[check]", "[check]"] * 3)
        return seen, last, reward, info

    assert await deal(3) == await deal(3)
    assert len({str((await deal(seed))[0][:2]) for seed in range(6)}) > 1  # the seed decides the cards
    seen, _, _, _ = await deal(3)
    assert seen[0][0] == "player_1"  # Kuhn Poker's first round opens with player 1, and reset says so


async def test_an_invalid_move_is_retried_once_then_loses():
    env = TextArenaEnv(TTT)
    await env.reset(seed=0)
    await env.step("[4]")
    obs, reward, terminated, _, info = await env.step("[4]")  # player 1 on an occupied cell
    assert not terminated and info == {"role": "player_1"} and "attempted an invalid move" in obs
    assert "cell 4 is already occupied" in obs
    obs, reward, terminated, _, info = await env.step("four")
    assert terminated and reward == -1.0 and info["rewards"] == {"player_0": 1.0, "player_1": -1.0}
    assert info["success"] is False and info["metrics"]["invalid_move"] == 1.0


@pytest.mark.parametrize("game", [TTT, NIM, KUHN])
async def test_random_moves_are_legal_and_rewards_zero_sum(game):
    env = TextArenaEnv(game)
    for seed in range(30):
        rng = random.Random(seed)
        _, info = await env.reset(seed=seed)
        for _ in range(100):
            acting = info["role"]
            obs, reward, terminated, _, info = await env.step(env.sample_action(rng))
            assert "invalid move" not in obs
            if terminated:
                break
        assert terminated and info["metrics"]["invalid_move"] == 0.0
        assert sum(info["rewards"].values()) == 0.0 and reward == info["rewards"][acting]
        assert info["success"] == (reward > 0)


def test_moves_of_other_games_are_read_from_the_last_available_list():
    text = "Available Moves: '[0]', '[1]'\n[Player 0] [1]\n[GAME] Current Board ...\nAvailable Moves: '[0]', '[5]'"
    assert available_moves(text) == ["[0]", "[5]"] and available_moves("[GAME] no list here") == []


async def _after(game, moves):
    env = TextArenaEnv(game)
    await env.reset(seed=0)
    for move in moves:
        await env.step(move)
    return env


async def test_the_tictactoe_script_wins_then_blocks():
    win = await _after(TTT, ["[0]", "[3]", "[1]", "[4]"])  # player 0 can win at 2 or block at 5
    block = await _after(TTT, ["[0]", "[3]", "[8]", "[4]"])  # player 0's diagonal is taken: block at 5
    assert {win.demonstration(random.Random(k), ())[0] for k in range(10)} == {"[2]"}
    assert {block.demonstration(random.Random(k), ())[0] for k in range(10)} == {"[5]"}
    opening = await _after(TTT, [])
    assert len({opening.demonstration(random.Random(k), ())[0] for k in range(20)}) > 3  # random, so they vary


async def test_the_nim_script_moves_to_nim_sum_zero():
    start = await _after(NIM, [])  # piles 3, 4, 5: nim-sum 2, only taking 2 from pile 0 leaves 0
    assert {start.demonstration(random.Random(k), ())[0] for k in range(10)} == {"[0 2]"}


@pytest.mark.parametrize("game,margin", [(TTT, 0.2), (NIM, 0.35), (KUHN, 0.15)])
def test_the_demonstration_beats_a_random_player(game, margin):
    env = TextArenaEnv(game)
    seeds = tuple(range(40))
    rand = dict.fromkeys(env.roles, env.sample_action)
    random_rates = win_rates(env, rand, seeds, 1)
    for role in env.roles:
        demo_rate = win_rates(env, {**rand, role: env.demo_move}, seeds, 1)[role]
        assert demo_rate >= random_rates[role] + margin, (role, demo_rate, random_rates[role])


async def test_demonstrations_are_legal_in_both_seats():
    for game in (TTT, NIM, KUHN):
        env = TextArenaEnv(game)
        for seed in range(10):
            rng = random.Random(seed)
            await env.reset(seed=seed)
            terminated = False
            while not terminated:
                obs, _, terminated, _, info = await env.step(env.demonstration(rng, ())[0])
                assert "invalid move" not in obs
            assert info["metrics"]["invalid_move"] == 0.0


def test_tictactoe_passes_check_env():
    assert check_env(lambda: TextArenaEnv(TTT))["episodes"] == 9


class _Played:
    def __init__(self, seed):
        self.env_seed, self.reset_info = seed, {"seed": seed}


def test_references_are_each_seats_win_rates():
    env = TextArenaEnv(NIM, baseline_plays=2)
    got = env.eval_baselines([_Played(s) for s in range(4)])
    assert set(got) == {"random_win_player_0", "random_win_player_1", "demo_win_player_0", "demo_win_player_1"}
    assert all(0.0 <= v <= 1.0 for v in got.values()) and got["demo_win_player_0"] == 1.0  # Nim 3-4-5: first wins
    assert env.eval_baselines([_Played(s) for s in range(4)]) == got
