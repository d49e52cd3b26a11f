"""The seeds' env side (AReaL's legacy API): `EnvironmentService` and `math_verify_call`.

`EnvironmentService` is the base the seeds' envs subclass: an async gym-like pair
`reset(seed=None, options=None) -> (obs, info)` and `step(action) -> (obs, reward, terminated,
truncated, info)`, where a seed-style agent steps with `(qid, answers)` and gets one reward per
answer. Nothing else is required: `close`, `instructions` and `sample_action` are optional
everywhere agentrl builds or plays an env. A `reset` that returns `None` as the observation
means "the question comes from the dataset" (seed 001's `MathCodeSingleStepEnv`): the env is
then built with `args.dataset_path`, and the prompts are that file's rows (agents/compat.py).

`math_verify_call(id2info, answers, query_ids)` grades answers the way AReaL's does: 1.0 when
math-verify finds the answer equal to one of `id2info[qid]["solutions"]` (or its `"answer"`),
else 0.0. It is blocking and meant for `await asyncio.to_thread(math_verify_call, ...)`, as
the seeds call it. It grades through the process pool of `math_grader.py` (so a pathological
answer is cut off after `timeout` seconds instead of hanging the thread); calls from several
threads at once take turns on one dedicated grader, under a lock, each call's answers in one
round trip.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.envs.math_grader import Grader
from agentrl.errors import EnvError


class EnvironmentService:
    """Base of a seed-style env: override the async `step` (and `reset` when the env itself
    picks the question); `close` is optional and does nothing here."""

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Start an episode; the default says the question comes from the dataset."""
        return None, {}

    async def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        """Apply `action` (the seeds: `(qid, answers)`); return one reward per answer."""
        raise NotImplementedError(f"{type(self).__name__} must define async step(self, action)")

    def close(self) -> None:
        """Release resources (nothing by default)."""


def close_env(env: Any) -> None:
    """Call `env.close()` when the env has one (seed-style envs need not)."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


_LOCK = threading.Lock()
_GRADER: Grader | None = None


def _grader() -> Grader:
    global _GRADER
    if _GRADER is None:
        import atexit

        _GRADER = Grader()
        atexit.register(_GRADER.shutdown)
    return _GRADER


def _solutions(id2info: Mapping[str, Any], qid: str) -> list[str]:
    """The reference answers of `qid`: its `solutions` list, else its `answer`."""
    key = str(qid).split("@")[0]
    if key not in id2info:
        raise EnvError(f"math_verify_call: query id {key!r} is not in id2info ({len(id2info)} entries)")
    info = id2info[key]
    sols = info.get("solutions", info.get("answer")) if isinstance(info, Mapping) else info
    if sols is None:
        raise EnvError(f"math_verify_call: id2info[{key!r}] has neither 'solutions' nor 'answer'")
    return [str(s) for s in sols] if isinstance(sols, (list, tuple)) else [str(sols)]


def math_verify_call(id2info: Mapping[str, Any], answers: Sequence[str], query_ids: Sequence[str],
                     timeout: float = 5.0) -> list[float]:
    """1.0 or 0.0 per answer: whether math-verify finds it equal to a reference of its query id.

    Blocking and thread-safe: call it with `await asyncio.to_thread(math_verify_call, ...)`."""
    if len(answers) != len(query_ids):
        raise EnvError(f"math_verify_call: {len(answers)} answers but {len(query_ids)} query ids; "
                       "pass one query id per answer")
    golds = [_solutions(id2info, q) for q in query_ids]

    async def grade_all() -> list[float]:
        grader = _grader()
        grades = await asyncio.gather(*(grader.grade(g, str(a), timeout) for a, gs in zip(answers, golds)
                                        for g in gs))
        out, k = [], 0
        for gs in golds:
            out.append(float(any(x.correct for x in grades[k:k + len(gs)])))
            k += len(gs)
        return out

    def run() -> list[float]:
        with _LOCK:  # one grader, one event loop at a time: its pool is not shared across loops at once
            return asyncio.run(grade_all())

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    # Called straight from a coroutine (not through asyncio.to_thread): this thread has a running
    # loop, so grade in a helper thread and wait (it blocks that loop, as any blocking call would).
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = run()
        except BaseException as e:  # re-raised in the caller's thread below
            box["error"] = e

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
