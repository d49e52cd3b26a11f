"""Misbehaving envs (imported by the tests that run them through check_env and through a run).

`BadLake(fault=..., every=k)` is FrozenLake that breaks its contract in one way on the episodes
whose env seed is a multiple of `every` (every=1: all of them). `phase` narrows the faulty
episodes to the warm start's demonstrations (`demo`) or to the others (`run`); `once` to the
first step of a faulty episode in the process. ESCAPES raise what is not an Exception from
`step`; HANGS never return from it.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time

from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.registry import register_env
from agentrl.rollout.tasks import DEMO_SEED_BASE

FAULTS = {
    # fault: (what the env does, words the error must contain)
    "string_reward": ("step returns the reward as the string '1.0'", "reward='"),
    "success_no": ("the last step's info['success'] is the string 'no'", "info['success']='no'"),
    "nan_reward": ("step returns a NaN reward", "reward=nan"),
    "inf_reward": ("step returns an infinite reward", "reward=inf"),
    "dict_obs_reset": ("reset returns a dict observation", "observation is dict"),
    "dict_obs_step": ("step returns a dict observation", "observation is dict"),
    "int_flag": ("step returns terminated as an int", "terminated=0"),
    "list_info": ("step returns a list as info", "info is list"),
    "string_metric": ("info['metrics'] holds a string", "info['metrics'] has"),
    "short_step": ("step returns a 3-tuple", "returned ("),
    "huge_reward": ("step returns the int 10**400 as reward (no float holds it)", "reward=100000"),
}
ESCAPES = {
    # fault: (what step does, words the error must contain)
    "sys_exit": ("step calls sys.exit(3)", "SystemExit in step: 3"),
    "keyboard_interrupt": ("step raises KeyboardInterrupt", "KeyboardInterrupt in step"),
    "base_exception": ("step raises a BaseException that is not an Exception", "Escape in step: out of the lake"),
}
HANGS = {
    "async_hang": "step awaits forever",
    "sync_block": "step blocks its event loop's thread (time.sleep) for an hour, saying so on stderr first",
}


class Escape(BaseException):
    """Raised by the `base_exception` fault."""


class BadLake:
    """FrozenLake that breaks its contract with `fault` on seeds that are multiples of `every`."""

    fired = 0  # faulty steps taken in this process (`once` stops after the first)

    def __init__(self, fault: str = "", every: int = 1, close_raises: bool = False, first_obs_chars: int = 0,
                 phase: str = "all", once: bool = False, **lake_args) -> None:
        self.lake = FrozenLakeEnv(**lake_args)
        self.instructions = self.lake.instructions
        self.fault, self.every, self.close_raises, self.first_obs_chars = fault, every, close_raises, first_obs_chars
        self.phase, self.once = phase, once
        self.faulty = False

    async def reset(self, seed=None, options=None):
        obs, info = await self.lake.reset(seed=seed, options=options)
        demo = (seed or 0) >= DEMO_SEED_BASE
        in_phase = self.phase == "all" or (self.phase == "demo") == demo
        self.faulty = bool(self.fault) and in_phase and (seed or 0) % self.every == 0
        if self.first_obs_chars:
            obs = "~" * self.first_obs_chars + "\n" + obs
        if self.faulty and self.fault == "dict_obs_reset":
            return {"board": obs}, info
        return obs, info

    async def step(self, action):
        if self.faulty and self.once and BadLake.fired:
            self.faulty = False
        BadLake.fired += self.faulty
        f = self.fault if self.faulty else ""
        if f == "sys_exit":
            sys.exit(3)
        if f == "keyboard_interrupt":
            raise KeyboardInterrupt
        if f == "base_exception":
            raise Escape("out of the lake")
        if f == "async_hang":
            await asyncio.Event().wait()
        if f == "sync_block":
            print("bad_lake: blocking", file=sys.stderr, flush=True)  # a test may wait for it
            time.sleep(3600)
        obs, reward, terminated, truncated, info = await self.lake.step(action)
        if not self.faulty:
            return obs, reward, terminated, truncated, info
        if f == "string_reward":
            reward = str(float(reward))
        elif f == "success_no" and (terminated or truncated):
            info = {**info, "success": "no"}
        elif f == "nan_reward":
            reward = math.nan
        elif f == "inf_reward":
            reward = math.inf
        elif f == "huge_reward":
            reward = 10**400
        elif f == "dict_obs_step":
            obs = {"board": obs}
        elif f == "int_flag":
            terminated = int(terminated)
        elif f == "list_info":
            info = list(info.items())
        elif f == "string_metric":
            info = {**info, "metrics": {"distance": "far"}}
        elif f == "short_step":
            return obs, reward, terminated
        return obs, reward, terminated, truncated, info

    def sample_action(self, rng):
        return self.lake.sample_action(rng)

    def close(self):
        self.lake.close()
        if self.close_raises:
            raise RuntimeError("the lake will not close")


register_env("bad_lake", BadLake, overwrite=True)
