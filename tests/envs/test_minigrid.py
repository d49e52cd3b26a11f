"""MiniGrid and BabyAI through env.type=minigrid: the contract, the text view, MiniGrid's own rewards,
seeding, the references, and bad arguments in one line."""

import asyncio
import random

import pytest

pytest.importorskip("minigrid", reason="minigrid is not installed (pip install 'agentrl[minigrid]')")

import gymnasium as gym  # noqa: E402
from minigrid.utils.baby_ai_bot import BabyAIBot  # noqa: E402

from agentrl.envs.checker import check_env  # noqa: E402
from agentrl.envs.minigrid import ACTIONS, MiniGridTextEnv, parse_action  # noqa: E402
from agentrl.errors import ConfigError, EnvError  # noqa: E402

GOTO = "BabyAI-GoToObj-v0"


@pytest.mark.parametrize("env_id", [GOTO, "MiniGrid-Empty-5x5-v0", "MiniGrid-DoorKey-5x5-v0"])
def test_levels_pass_check_env(env_id):
    assert check_env(lambda: MiniGridTextEnv(env_id, {"max_steps": 20}))["episodes"] == 9


@pytest.mark.parametrize("reply, action", [
    ("<answer>forward</answer>", "forward"), ("I turn. <answer>Turn LEFT</answer>", "left"),
    ("<answer>pick up</answer>", "pickup"), ("toggle", "toggle"), ("<answer>done", "done"),
    ("<answer>left</answer><answer>right</answer>", "right"), ("drop it", "drop"),
])
def test_a_reply_names_one_of_minigrids_actions(reply, action):
    assert parse_action(reply) == ACTIONS.index(action)


@pytest.mark.parametrize("reply", ["", "go", "<answer>left or right</answer>", "leftward", "<answer></answer>", None])
def test_a_reply_naming_none_or_two_actions_names_no_action(reply):
    assert parse_action(reply) is None


async def test_the_view_as_text():
    env = MiniGridTextEnv("MiniGrid-DoorKey-5x5-v0")
    obs, info = await env.reset(seed=1)
    assert obs == ("Mission: use the key to open the door and then get to the goal.\n"
                   "In front: yellow key 1 step ahead. Left: locked yellow door. Right: wall. Carrying: nothing.\n"
                   "Seen: locked yellow door 1 left; yellow key 1 ahead.")
    assert info == {"seed": 1, "mission": "use the key to open the door and then get to the goal"}
    obs = (await env.step("<answer>pickup</answer>"))[0]
    assert "In front: wall 2 steps ahead." in obs and "Carrying: yellow key." in obs
    await env.step("<answer>left</answer>")
    obs = (await env.step("<answer>toggle</answer>"))[0]
    assert obs.endswith("In front: open yellow door 1 step ahead. Left: empty. Right: empty. Carrying: yellow key.\n"
                        "Seen: open yellow door 1 ahead; goal 2 ahead 1 right.")


def _actions(seed: int) -> list[int]:
    """BabyAIBot's actions on `seed` with a few random ones mixed in: successes and failures both."""
    env, rng = gym.make(GOTO, max_steps=16), random.Random(seed)
    env.reset(seed=seed)
    bot, out = BabyAIBot(env), []
    while True:
        action = int(bot.replan()) if rng.random() < 0.7 else rng.randrange(len(ACTIONS))
        out.append(action)
        terminated, truncated = env.step(action)[2:4]
        if terminated or truncated:
            return out


@pytest.mark.parametrize("seed", range(6))
async def test_rewards_and_ends_are_minigrids_own(seed):
    """Our env and MiniGrid driven side by side with one seed and one action list agree at every step."""
    ours, theirs = MiniGridTextEnv(GOTO, {"max_steps": 16}), gym.make(GOTO, max_steps=16)
    await ours.reset(seed=seed)
    theirs.reset(seed=seed)
    for action in _actions(seed):
        obs, reward, terminated, truncated, info = await ours.step(f"<answer>{ACTIONS[action]}</answer>")
        their_obs, their_reward, their_terminated, their_truncated, _ = theirs.step(action)
        assert (reward, terminated) == (float(their_reward), their_terminated)
        assert truncated == (their_truncated and not their_terminated)  # a step is one or the other
        assert obs.startswith(f"Mission: {their_obs['mission']}.\n")
    assert info["success"] == (terminated and reward > 0)


async def test_an_invalid_reply_is_a_penalised_no_op_that_uses_up_a_step():
    env = MiniGridTextEnv(GOTO, {"max_steps": 3}, format_penalty=-0.5)
    first, _ = await env.reset(seed=2)
    obs, reward, terminated, truncated, info = await env.step("I am not sure")
    assert (obs, reward, terminated, truncated) == (first, -0.5, False, False)
    assert info == {"action_valid": False, "action": None}
    assert env.unwrapped.step_count == 0  # it never reached MiniGrid
    await env.step("<answer>left</answer>")
    obs, reward, terminated, truncated, info = await env.step("?")
    assert (terminated, truncated, info["success"]) == (False, True, False)  # MiniGrid's 3 steps, ours counted
    with pytest.raises(EnvError, match="finished episode"):
        await env.step("<answer>left</answer>")


async def _episode(env, seed, replies):
    out = [await env.reset(seed=seed)]
    for reply in replies:
        out.append(await env.step(reply))
        if out[-1][2] or out[-1][3]:
            break
    return out


async def test_a_seed_replays_its_episode_and_concurrent_envs_share_nothing():
    replies = [f"<answer>{a}</answer>" for a in ("forward", "left", "forward", "right", "forward", "pickup")]
    alone = [await _episode(MiniGridTextEnv(GOTO), s, replies) for s in (3, 4)]
    env = MiniGridTextEnv(GOTO)
    assert [await _episode(env, s, replies) for s in (4, 3)] == alone[::-1]
    together = await asyncio.gather(*(_episode(MiniGridTextEnv(GOTO), s, replies) for s in (3, 4)))
    assert list(together) == alone
    assert alone[0][0] != alone[1][0]  # two seeds, two rooms


async def test_sample_action_and_the_bots_demonstration():
    env = MiniGridTextEnv(GOTO)
    await env.reset(seed=5)
    replies = {env.sample_action(random.Random(k)) for k in range(64)}
    assert replies == {f"<answer>{a}</answer>" for a in ACTIONS}
    demo = env.demonstration(random.Random(0), ("python",))
    assert demo == env.demonstration(random.Random(1), ("python",))  # the bot's, the env left as it was
    bot = MiniGridTextEnv(GOTO)
    await bot.reset(seed=5)
    assert demo == [f"<answer>{ACTIONS[int(BabyAIBot(bot._gym).replan())]}</answer>"]


class _Played:
    def __init__(self, seed):
        self.env_seed = seed


def test_the_references_are_a_random_policy_and_minigrids_bot():
    env = MiniGridTextEnv(GOTO, {"max_steps": 12}, baseline_plays=2)
    got = env.eval_baselines([_Played(s) for s in range(16)])
    assert set(got) == {"random", "bot"} and got["bot"] == 1.0 and 0.0 <= got["random"] < 0.3
    assert env.eval_baselines([_Played(s) for s in range(16)]) == got
    empty = MiniGridTextEnv("MiniGrid-Empty-5x5-v0", baseline_plays=2).eval_baselines([_Played(0)])
    assert set(empty) == {"random"}  # no BabyAI instructions: no bot


def test_bad_arguments_are_one_line():
    with pytest.raises(ConfigError, match="not a MiniGrid or BabyAI id .* Did you mean 'BabyAI-GoToObj-v0'"):
        MiniGridTextEnv("BabyAI-GoToObject-v0")
    with pytest.raises(ConfigError, match="Did you mean 'MiniGrid-Empty-5x5-v0'"):
        MiniGridTextEnv("MiniGrid-Empty-5X5-v0")
    with pytest.raises(ConfigError, match=r"gymnasium.make\('BabyAI-GoToObj-v0', \*\*\{'max_step': 3\}\) failed: "
                                          r"TypeError: .*unexpected keyword argument 'max_step'"):
        MiniGridTextEnv(GOTO, {"max_step": 3})
    with pytest.raises(ConfigError, match="kwargs=.1. is invalid; kwargs must be a mapping"):
        MiniGridTextEnv(GOTO, [1])
    with pytest.raises(ConfigError, match="format_penalty='x' is invalid"):
        MiniGridTextEnv(GOTO, format_penalty="x")
    for error in ("BabyAI-GoToObject-v0", {"max_step": 3}):
        try:
            MiniGridTextEnv(*(error,) if isinstance(error, str) else (GOTO, error))
        except ConfigError as e:
            assert "\n" not in str(e)
