"""`check_env`: runs an env through its contract and says exactly what broke.

In the spirit of Gymnasium's `gymnasium/utils/env_checker.py`, for our async text envs
(`agentrl.envs.base.Env`). It checks, in order:

1. the API: `instructions` is a non-empty string, `reset`/`step` are coroutines, `sample_action`
   and `close` are callable;
2. reset: returns `(str, dict)`, with `optimal_success` in [0, 1] when given; `reset()` without
   a seed works too;
3. random episodes (`sample_action`) to their end: every step returns `(str, finite number,
   bool, bool, dict)`, terminated and truncated are never both true, the last step's info has a
   bool `success` and, when present, `metrics` maps names to finite numbers; a step after the
   end raises the env's EnvError or returns a well-formed step;
4. determinism: a fresh env and a reused env, reset with the same seed and fed the same actions,
   give the same observations, rewards, flags and infos;
5. adversarial replies (empty, huge, unicode, lone surrogates, control bytes, numbers, tags,
   several directions at once) are ordinary steps, never exceptions;
6. `close()`, when the env has one (it is optional), may be called twice.

The first failure raises `EnvCheckError` naming the env, the check and the offending value.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable
from typing import Any, NoReturn

from agentrl.envs.contract import reset_problem, step_problem
from agentrl.envs.contract import short as _short
from agentrl.envs.service import close_env
from agentrl.errors import EnvError, must_propagate

ADVERSARIAL_REPLIES = (
    "", " ", "\n\t\r", "x" * 1_000_000, "<answer>" * 20_000, "</answer>" * 20_000,
    "<answer></answer>", "<answer>Left", "</answer>Up<answer>", "<answer><answer>Up</answer></answer>",
    "left right up down", "Up Down", "<answer>Left</answer><answer>Right Up</answer>",
    "0", "1", "-1", "3.14", "1e308", "NaN", "inf", "12345678901234567890" * 50,
    "😀🎉", "←→", "↑", "ÜP", "İ" * 10_000, "\u202eLeft", "\ud800", "\udfff<answer>Up</answer>",
    "\x00\x01\x1b[31mUp\x1b[0m", "<|im_end|>", "<|im_start|>assistant\n", "<think>Up</think>",
    "{\"action\": \"Up\"}", "None", "UP!!!", "l", "L R", "up" * 100_000,
)


class EnvCheckError(EnvError):
    """An env breaks its contract; the message names the env, the check and the value."""


class _Checker:
    """Holds the env factory and the name used in every message."""

    def __init__(self, make_env: Callable[[], Any], max_episode_steps: int) -> None:
        self.make_env = make_env
        self.max_episode_steps = max_episode_steps
        self.name = "env"

    def fail(self, check: str, detail: str) -> NoReturn:
        """Raise EnvCheckError naming the env, the check and what went wrong."""
        raise EnvCheckError(f"check_env({self.name}): {check}: {detail}")

    # ---------------------------------------------------------------- the calls, guarded
    def build(self) -> Any:
        try:
            return self.make_env()
        except Exception as e:
            self.fail("build", f"make_env() raised {type(e).__name__}: {e}")

    def close(self, env: Any, what: str) -> None:
        try:
            close_env(env)  # optional: seed-style envs have reset and step only
        except Exception as e:
            self.fail("close", f"{what} raised {type(e).__name__}: {e}")

    def sample(self, env: Any, rng: random.Random) -> str:
        try:
            action = env.sample_action(rng)
        except Exception as e:
            self.fail("sample_action", f"raised {type(e).__name__}: {e}")
        if not isinstance(action, str):
            self.fail("sample_action", f"returned {_short(action)}; expected a str reply")
        return action

    async def reset(self, env: Any, seed: int | None) -> tuple[str, dict]:
        try:
            result = await env.reset(seed=seed)
        except BaseException as e:  # SystemExit and the like too: the env's, to report, not to exit on
            if must_propagate(e):  # asyncio's cancellation, a real Ctrl-C
                raise
            self.fail("reset", f"reset(seed={seed}) raised {type(e).__name__}: {e}")
        self.check_reset(result, seed)
        return result

    async def step(self, env: Any, action: str, where: str) -> tuple:
        try:
            result = await env.step(action)
        except BaseException as e:
            if must_propagate(e):
                raise
            self.fail("step", f"step({_short(action)}) {where} raised {type(e).__name__}: {e}")
        self.check_step(result, action, where)
        return result

    # ---------------------------------------------------------------- return values
    def check_reset(self, result: Any, seed: int | None) -> None:
        problem = reset_problem(result)
        if problem:
            self.fail(problem[0], f"reset(seed={seed}) {problem[1]}")

    def check_step(self, result: Any, action: str, where: str) -> None:
        problem = step_problem(result)
        if problem:
            self.fail(problem[0], f"step({_short(action)}) {where} {problem[1]}")

    # ---------------------------------------------------------------- the checks
    def check_api(self, env: Any) -> None:
        if not (isinstance(getattr(env, "instructions", None), str) and env.instructions):
            self.fail("api", "instructions must be a non-empty str")
        for method in ("reset", "step"):
            if not inspect.iscoroutinefunction(getattr(env, method, None)):
                self.fail("api", f"{method} must be an async method")
        if not callable(getattr(env, "sample_action", None)):
            self.fail("api", "sample_action must be a method (check_env plays random episodes with it)")
        if getattr(env, "close", None) is not None and not callable(env.close):
            self.fail("api", "close must be a method (or absent: it is optional)")

    async def play(self, env: Any, seed: int) -> list:
        """Reset with `seed` and play `sample_action` to the end; the transcript of the episode."""
        transcript: list = [await self.reset(env, seed)]
        rng = random.Random(seed)
        for n in range(1, self.max_episode_steps + 1):
            action = self.sample(env, rng)
            result = await self.step(env, action, f"at step {n} of episode seed={seed}")
            transcript.append((action, result))
            if result[2] or result[3]:
                await self.step_after_end(env, seed)
                return transcript
        self.fail("episode end", f"episode seed={seed} did not end within {self.max_episode_steps} steps "
                  "of sample_action; pass max_episode_steps= if the env relies on the agent's max_turns")

    async def step_after_end(self, env: Any, seed: int) -> None:
        action = self.sample(env, random.Random(0))
        try:
            result = await env.step(action)
        except EnvError:
            return  # the documented answer
        except Exception as e:
            self.fail("step after end", f"episode seed={seed}: step() after the end raised {type(e).__name__}: "
                      f"{e}; raise EnvError (or return a well-formed step)")
        self.check_step(result, "...", f"after the end of episode seed={seed}")

    def compare(self, a: list, b: list, seed: int, what: str) -> None:
        if a[0] != b[0]:
            self.fail("determinism", f"{what}: reset(seed={seed}) gave {_short(a[0])} then {_short(b[0])}")
        for n, (x, y) in enumerate(zip(a[1:], b[1:]), start=1):
            if x != y:
                self.fail("determinism", f"{what}: step {n} of episode seed={seed} gave {_short(x)} then {_short(y)}")
        if len(a) != len(b):
            self.fail("determinism", f"{what}: episode seed={seed} ended after {len(a) - 1} then {len(b) - 1} steps")

    async def adversarial(self, env: Any, seed: int) -> None:
        for reply in ADVERSARIAL_REPLIES:
            await self.reset(env, seed)
            await self.step(env, reply, f"as the first reply of episode seed={seed}")


async def acheck_env(make_env: Callable[[], Any], seeds: tuple[int, ...] = (0, 1, 2),
                     max_episode_steps: int = 1000) -> dict[str, int]:
    """Async `check_env`; returns counts of what was run, raises EnvCheckError on a failure."""
    checker = _Checker(make_env, max_episode_steps)
    env = checker.build()
    fresh = checker.build()
    checker.name = type(env).__name__
    try:
        checker.check_api(env)
        await checker.reset(env, None)
        steps = 0
        for seed in seeds:
            first = await checker.play(env, seed)
            again = await checker.play(env, seed)
            checker.compare(first, again, seed, "the same env reset again")
            checker.compare(first, await checker.play(fresh, seed), seed, "a fresh env")
            steps += 3 * (len(first) - 1)
        await checker.adversarial(env, seeds[0] if seeds else 0)
    except EnvCheckError:
        for e in (env, fresh):  # the failed check is the news, not a close() that fails after it
            try:
                close_env(e)
            except Exception:
                pass
        raise
    checker.close(fresh, "close()")
    checker.close(env, "close()")
    checker.close(env, "close() twice")
    return {"episodes": 3 * len(seeds), "steps": steps, "adversarial_replies": len(ADVERSARIAL_REPLIES)}


def check_env(make_env: Callable[[], Any], seeds: tuple[int, ...] = (0, 1, 2),
              max_episode_steps: int = 1000) -> dict[str, int]:
    """Run the env made by `make_env` through its contract (see the module docstring).

    Returns counts of episodes, steps and adversarial replies run; raises EnvCheckError naming
    the first broken check. Call `acheck_env` from inside an event loop.
    """
    return asyncio.run(acheck_env(make_env, seeds, max_episode_steps))


def builtin_env_names() -> list[str]:
    """Names of the envs agentrl itself registers (registry.BUILTIN_MODULES)."""
    from agentrl.registry import ENVS, load_builtins

    load_builtins()
    return [name for name in ENVS.names() if getattr(ENVS.get(name), "__module__", "").startswith("agentrl.envs.")]
