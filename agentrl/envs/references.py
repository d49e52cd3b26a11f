"""An env's references (a random policy's success, a scripted solver's), computed once per set of
evaluated seeds: evaluation plays the same seeds every time, and a reference costs many episodes."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from agentrl.errors import EnvError

T = TypeVar("T")


class PerSeeds:
    """`compute(seeds)` for the seeds of the evaluated trajectories, cached per set of seeds."""

    def __init__(self, compute: Callable[[tuple[int, ...]], Mapping[str, float]]) -> None:
        self.compute = compute
        self._known: dict[tuple[int, ...], dict[str, float]] = {}

    def __call__(self, trajectories: list) -> dict[str, float]:
        """The references on these trajectories' seeds ({} when there are none)."""
        seeds = tuple(sorted(t.env_seed for t in trajectories))
        if not seeds:
            return {}
        if seeds not in self._known:
            self._known[seeds] = dict(self.compute(seeds))
        return dict(self._known[seeds])


async def policy_success(env: Any, policy: Callable[[random.Random], str], seeds: tuple[int, ...], plays: int,
                         turns: int = 1000) -> float:
    """Mean success of `policy` at every turn of the async env `env` over `plays` plays of each seed
    (a play the env fails counts as lost, as a failed episode is not a win)."""
    wins = 0
    for seed in seeds:
        for k in range(plays):
            rng = random.Random(seed * 7919 + k)
            try:
                await env.reset(seed=seed)
                for _ in range(turns):
                    _, _, terminated, truncated, info = await env.step(policy(rng))
                    if terminated or truncated:
                        wins += bool(info.get("success"))
                        break
            except EnvError:
                pass
    return wins / (len(seeds) * plays)


def run_apart(coro: Coroutine[Any, Any, T]) -> T:
    """`coro` run to its end on an event loop of a thread of its own (the caller may be inside a loop)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(coro))
        except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
            errors.append(e)

    thread = threading.Thread(target=run, name="reference")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]
