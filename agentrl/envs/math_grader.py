"""Grading math answers with `math-verify`, off the event loop and under a time limit.

math-verify decides whether an answer equals the reference (`\\boxed{1/2}` equals `0.5`). Its
own time limits use `signal.alarm`, which works only in a main thread, and some inputs hang
sympy for minutes (`9^{9^{9^{9}}}` is measured at over 20 s) in C code that no signal and no
thread can stop. So grading runs in a worker *process* with math-verify's timeouts off
(`parsing_timeout=None`, `timeout_seconds=None`), and the caller awaits it with its own limit;
when the limit passes, the worker is killed and a fresh one is started for the next answer.

The pool is persistent and shared by every math env in the process: it starts (and imports
math-verify) once, outside any time limit, so a grade costs one inter-process round trip
(see benchmarks/math_grading.py). At most `workers` answers are in flight at once; the others
wait in asyncio, so an answer's time limit counts only its own grading. `shutdown_grader()`
(also run at exit) stops the workers.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

MAX_ANSWER_CHARS = 4096  # the final answer sits at the end of a reply; the tail is what is graded


@dataclass(frozen=True)
class Grade:
    """The verdict on one answer."""

    correct: bool
    parsed: bool  # math-verify found an answer in the reply at all
    timed_out: bool = False


def _worker_init() -> None:
    """Import math-verify and run it once, so the first real grade pays no start-up cost."""
    import logging

    # math-verify warns on every call that its own timeouts are off: we enforce ours.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _grade_in_worker("1", "1")


def _ping() -> bool:
    return True


def _parse_gold(gold: str) -> list:
    from math_verify import parse

    parsed = parse(gold, parsing_timeout=None)
    if not parsed and "$" not in gold:  # bare LaTeX such as \frac{1}{2} needs delimiters
        parsed = parse(f"${gold}$", parsing_timeout=None)
    return parsed


def _grade_in_worker(gold: str, answer: str) -> tuple[bool, bool]:
    """(correct, parsed): math-verify with its signal-based timeouts off (runs in a worker)."""
    from math_verify import parse, verify

    try:
        target = _parse_gold(gold)
        found = parse(answer, parsing_timeout=None)
        if not found:
            return False, False
        return bool(verify(target, found, timeout_seconds=None)), True
    except Exception:  # math-verify and sympy raise many things on odd input: a wrong answer
        return False, False


def _context() -> multiprocessing.context.BaseContext:
    """fork where it is safe (Linux), as torch's DataLoader does; spawn elsewhere.

    spawn re-runs the parent's main module in each worker, which breaks a user's training
    script that lacks an `if __name__ == "__main__":` guard. A forked worker only runs
    math-verify: it never touches the torch thread pools it inherits.
    """
    import sys

    method = "fork" if sys.platform.startswith("linux") else "spawn"
    return multiprocessing.get_context(method)


class Grader:
    """A persistent pool of grading processes; `grade` is async and never exceeds its timeout."""

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"Grader needs at least one worker, got {workers}")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._warm: list = []
        self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> Semaphore
        self.timeouts = 0  # answers whose grading was cut off, over the grader's lifetime
        self.restarts = 0  # workers killed and replaced because of a time limit

    # ------------------------------------------------------------------ public API
    async def grade(self, gold: str, answer: str, timeout: float) -> Grade:
        """Grade `answer` against `gold`; an answer not graded within `timeout` s is wrong."""
        answer = answer[-MAX_ANSWER_CHARS:]
        loop = asyncio.get_running_loop()
        async with self._slot(loop):
            for attempt in range(2):
                pool = self._ensure_pool()
                # Start-up (spawn, imports, first parse) is not the answer's time: wait it out first.
                await asyncio.gather(*(asyncio.wrap_future(f) for f in self._warm))
                future = loop.run_in_executor(pool, _grade_in_worker, gold, answer)
                try:
                    correct, parsed = await asyncio.wait_for(future, timeout)
                    return Grade(correct, parsed)
                except asyncio.TimeoutError:
                    self.timeouts += 1
                    self.restarts += 1
                    self._kill(pool)
                    return Grade(False, False, timed_out=True)
                except BrokenProcessPool:
                    # Another answer's time limit killed the worker under this one: grade it again.
                    self._kill(pool)
        return Grade(False, False, timed_out=True)

    def shutdown(self) -> None:
        """Stop the worker processes (safe to call twice; a later grade starts new ones)."""
        if self._pool is not None:
            self._kill(self._pool)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return [p.pid for p in procs.values() if p.is_alive()]

    # ------------------------------------------------------------------ internals
    def _slot(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        # asyncio primitives bind to one event loop, and every collect() runs a new one.
        if loop not in self._slots:
            self._slots[loop] = asyncio.Semaphore(self.workers)
        return self._slots[loop]

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=_context(), initializer=_worker_init)
            self._warm = [self._pool.submit(_ping) for _ in range(self.workers)]
        return self._pool

    def _kill(self, pool: ProcessPoolExecutor) -> None:
        """Kill the pool's processes now (a hung sympy call ignores everything gentler)."""
        if pool is not self._pool:
            return
        # ProcessPoolExecutor has no public kill before Python 3.14 (kill_workers); its
        # _processes map is the documented-by-use way to reach the workers.
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            if p.is_alive():
                p.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        for p in procs:
            p.join(timeout=5)
        self._pool, self._warm = None, []


_GRADER: Grader | None = None


def shared_grader() -> Grader:
    """The process-wide grader every math env uses (started on first use)."""
    global _GRADER
    if _GRADER is None:
        _GRADER = Grader()
        atexit.register(shutdown_grader)
    return _GRADER


def shutdown_grader() -> None:
    """Stop the shared grader's worker processes."""
    if _GRADER is not None:
        _GRADER.shutdown()
