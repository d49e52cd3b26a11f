"""check_env passes for every built-in env and names what broke in a broken one."""

from __future__ import annotations

import random

import pytest

from helpers import builtin_env, env_param

from agentrl.envs.checker import ADVERSARIAL_REPLIES, EnvCheckError, acheck_env, builtin_env_names, check_env
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.envs.sokoban import SokobanEnv
from agentrl.errors import EnvError
from agentrl.registry import ENVS

CASES = {
    "frozen_lake fixed map": lambda: FrozenLakeEnv(map_name="4x4"),
    "frozen_lake random maps": lambda: FrozenLakeEnv(map_name=None, size=5, max_steps=20),
    "frozen_lake slippery 8x8": lambda: FrozenLakeEnv(map_name="8x8", is_slippery=True, max_steps=30),
    "sokoban": lambda: SokobanEnv(),
    "sokoban 2 boxes, shaped": lambda: SokobanEnv(dim_room=[7, 7], num_boxes=2, max_steps=30, progress_reward=1.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_builtin_env_configurations_pass(case):
    report = check_env(CASES[case])
    assert report["episodes"] == 9 and report["steps"] > 0
    assert report["adversarial_replies"] == len(ADVERSARIAL_REPLIES)


@pytest.mark.parametrize("name", [env_param(n) for n in builtin_env_names()])
def test_every_registered_builtin_env_passes_with_its_defaults(name):
    check_env(builtin_env(name))


def test_builtin_names_cover_our_envs_only():
    names = builtin_env_names()
    assert {"frozen_lake", "sokoban"} <= set(names)
    ENVS.register("test_checker_outsider", Walk, overwrite=True)
    assert "test_checker_outsider" not in builtin_env_names()


async def test_async_form_runs_inside_an_event_loop():
    assert (await acheck_env(lambda: SokobanEnv(max_steps=10), seeds=(5,)))["episodes"] == 3


# --- a small well-behaved env, and ways to break it -------------------------------------------


class Walk:
    """Walk up a ladder of 3 rungs with "Up"; anything else stays put. Passes check_env."""

    instructions = "Climb: answer Up."
    max_steps = 6

    def __init__(self) -> None:
        self.pos, self.steps, self.done, self.seed = 0, 0, True, 0

    async def reset(self, seed=None, options=None):
        self.pos, self.steps, self.done, self.seed = 0, 0, False, seed or 0
        return self.obs(), {"optimal_success": 1.0}

    def obs(self) -> str:
        return f"seed {self.seed}, rung {self.pos}"

    async def step(self, action):
        if self.done:
            raise EnvError("walk: finished")
        self.steps += 1
        self.pos += "up" in action.lower()
        terminated = self.pos >= 3
        truncated = not terminated and self.steps >= self.max_steps
        info = {"action_valid": True}
        if terminated or truncated:
            self.done = True
            info.update(success=terminated, metrics={"rung": float(self.pos)})
        return self.obs(), float(terminated), terminated, truncated, info

    def sample_action(self, rng):
        return rng.choice(["Up", "Down"])

    def close(self):
        self.done = True


def test_the_reference_env_passes():
    check_env(Walk)


class RaisesOnGarbage(Walk):
    async def step(self, action):
        if action.strip() not in ("Up", "Down"):
            raise ValueError(f"cannot parse {action!r}")
        return await super().step(action)


class GlobalRandomReset(Walk):
    async def reset(self, seed=None, options=None):
        obs, info = await super().reset(seed, options)
        return f"{obs}, wind {random.random():.3f}", info  # ignores the seed


class LeaksAcrossResets(Walk):
    async def reset(self, seed=None, options=None):
        keep = self.pos
        obs, info = await super().reset(seed, options)
        self.pos = keep % 3  # the last episode's rung survives the reset
        return self.obs(), info


class BothFlags(Walk):
    async def step(self, action):
        obs, r, term, trunc, info = await super().step(action)
        return obs, r, term, term or trunc, info


class NoSuccess(Walk):
    async def step(self, action):
        obs, r, term, trunc, info = await super().step(action)
        info.pop("success", None)
        return obs, r, term, trunc, info


class StringReward(Walk):
    async def step(self, action):
        obs, r, term, trunc, info = await super().step(action)
        return obs, str(r), term, trunc, info


class NumpyLikeFlag(Walk):
    async def step(self, action):
        obs, r, term, trunc, info = await super().step(action)
        return obs, r, int(term), trunc, info


class CrashAfterEnd(Walk):
    async def step(self, action):
        if self.done:
            raise IndexError("list index out of range")
        return await super().step(action)


class NeverEnds(Walk):
    max_steps = 10**9

    async def step(self, action):
        return await super().step("Down")


class SyncReset(Walk):
    def reset(self, seed=None, options=None):  # forgot async
        return self.obs(), {}


class NanMetric(Walk):
    async def step(self, action):
        obs, r, term, trunc, info = await super().step(action)
        if "metrics" in info:
            info["metrics"]["rung"] = float("nan")
        return obs, r, term, trunc, info


class ObservationOnly(Walk):
    async def reset(self, seed=None, options=None):
        return (await super().reset(seed, options))[0]


class BadOptimum(Walk):
    async def reset(self, seed=None, options=None):
        obs, _ = await super().reset(seed, options)
        return obs, {"optimal_success": 2.0}


class NoInstructions(Walk):
    instructions = ""


class CloseTwiceFails(Walk):
    def close(self):
        if getattr(self, "closed", False):
            raise RuntimeError("already closed")
        self.closed = True


@pytest.mark.parametrize("broken, message", [
    (RaisesOnGarbage, r"step: step\(''\) as the first reply .* raised ValueError: cannot parse"),
    (GlobalRandomReset, r"determinism: .*reset\(seed=0\) gave"),
    (LeaksAcrossResets, r"determinism: the same env reset again"),
    (BothFlags, r"episode end: .*terminated and truncated both True"),
    (NoSuccess, r"episode end: .*info\['success'\]=None"),
    (StringReward, r"step result: .*reward='0.0'"),
    (NumpyLikeFlag, r"step result: .*terminated=0; expected a bool"),
    (CrashAfterEnd, r"step after end: .*IndexError"),
    (NeverEnds, r"episode end: episode seed=0 did not end within 1000 steps"),
    (SyncReset, r"api: reset must be an async method"),
    (NanMetric, r"step result: .*info\['metrics'\] has \{'rung': nan\}"),
    (ObservationOnly, r"reset result: reset\(seed=None\) returned 'seed 0, rung 0'"),
    (BadOptimum, r"reset result: .*optimal_success'\]=2.0"),
    (NoInstructions, r"api: instructions must be a non-empty str"),
    (CloseTwiceFails, r"close: close\(\) twice raised RuntimeError"),
])
def test_broken_envs_are_caught_with_a_message_naming_the_check(broken, message):
    with pytest.raises(EnvCheckError, match=message) as err:
        check_env(broken)
    assert str(err.value).startswith(f"check_env({broken.__name__}): ")
    assert isinstance(err.value, EnvError)
