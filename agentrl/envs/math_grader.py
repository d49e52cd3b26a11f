"""Grading math answers with `math-verify`, off the event loop and under a time limit.

math-verify decides whether an answer equals the reference (`\\boxed{1/2}` equals `0.5`). Its
own time limits use `signal.alarm`, which works only in a main thread, and some inputs hang
sympy for minutes (`9^{9^{9^{9}}}` is measured at over 20 s) in C code that no signal and no
thread can stop. So grading runs in a worker *process* with math-verify's timeouts off
(`parsing_timeout=None`, `timeout_seconds=None`), and the caller awaits it with its own limit;
when the limit passes, the worker is killed and a fresh one is started for the next answer.

The pool is persistent and shared by every math env in the process: it starts (and imports
math-verify) once, outside any time limit, and the answers of one event-loop round share one
inter-process round trip (see benchmarks/math_grading.py). At most `workers` batches are in
flight at once; the others wait in asyncio, so a time limit counts only grading time.
`shutdown_grader()` (also run at exit) stops the workers.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

MAX_ANSWER_CHARS = 4096  # the final answer sits at the end of a reply; the tail is what is graded
CHUNK = 16  # answers per worker call: ~10 ms each, so a chunk stays far inside any sane time limit


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


def _grade_many(items: list[tuple[str, str, bool]]) -> list[tuple[bool, bool]]:
    """Grade a batch of (gold, answer, expression) in the worker."""
    return [_grade_in_worker(*item) for item in items]


def _parse_expression(text: str) -> list:
    """Parse `text` as one whole expression: `x + 1` read as plain text gives its last number,
    1, so text without LaTeX delimiters is read in math mode first."""
    from math_verify import parse

    if "$" in text or "\\boxed" in text:
        return parse(text, parsing_timeout=None)
    return parse(f"${text}$", parsing_timeout=None) or parse(text, parsing_timeout=None)


def _grade_in_worker(gold: str, answer: str, expression: bool = False) -> tuple[bool, bool]:
    """(correct, parsed): math-verify with its signal-based timeouts off (runs in a worker).

    The reference is always one expression; so is the answer when `expression` (the content of
    an answer tag), else it is free text in which math-verify looks for the final answer."""
    from math_verify import parse, verify

    try:
        target = _parse_expression(gold)
        found = _parse_expression(answer) if expression else parse(answer, parsing_timeout=None)
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


@dataclass
class _Item:
    gold: str
    answer: str
    expression: bool
    timeout: float
    future: asyncio.Future


@dataclass
class _LoopState:
    """Per event loop: answers waiting for the next batch, and the in-flight limit."""

    slots: asyncio.Semaphore
    pending: list = field(default_factory=list)
    flushing: bool = False


class Grader:
    """A persistent pool of grading processes; `grade` is async and bounded by its timeout.

    Answers submitted in the same round of the event loop are graded together, in worker calls
    of up to CHUNK answers, and handed back together: the episodes that sent them resume
    together, so their next requests meet in one engine batch (graded one by one, each episode
    would resume alone and the engine would decode it alone). A chunk gets the longest time
    limit among its answers; when it passes, the worker is killed and the chunk's answers are
    graded again one by one, so only the answer that hangs is cut off.
    """

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"Grader needs at least one worker, got {workers}")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._warm: list = []
        self._loops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> _LoopState
        self.timeouts = 0  # answers whose grading was cut off, over the grader's lifetime
        self.restarts = 0  # workers killed and replaced because of a time limit
        self.calls = 0  # worker round trips
        _ALL.add(self)

    # ------------------------------------------------------------------ public API
    async def grade(self, gold: str, answer: str, timeout: float, expression: bool = False) -> Grade:
        """Grade `answer` against `gold`; an answer not graded within `timeout` s is wrong.

        `expression`: `answer` is a bare final answer (read whole), not text to search."""
        loop = asyncio.get_running_loop()
        state = self._state(loop)
        item = _Item(gold, answer[-MAX_ANSWER_CHARS:], expression, timeout, loop.create_future())
        state.pending.append(item)
        if not state.flushing:
            state.flushing = True
            loop.create_task(self._flush(state))
        return await item.future

    def shutdown(self) -> None:
        """Stop the worker processes (safe to call twice; a later grade starts new ones)."""
        if self._pool is not None:
            self._kill(self._pool)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return [p.pid for p in procs.values() if p.is_alive()]

    # ------------------------------------------------------------------ batching
    def _state(self, loop: asyncio.AbstractEventLoop) -> _LoopState:
        # asyncio primitives bind to one event loop, and every collect() runs a new one.
        if loop not in self._loops:
            self._loops[loop] = _LoopState(asyncio.Semaphore(self.workers))
        return self._loops[loop]

    async def _flush(self, state: _LoopState) -> None:
        await asyncio.sleep(0)  # every episode that got its reply this round adds its answer first
        batch, state.pending, state.flushing = state.pending, [], False
        try:
            async with state.slots:  # one batch per worker at a time: a batch's clock is its own
                grades = []
                for k in range(0, len(batch), CHUNK):  # a chunk's time limit does not grow with the round
                    grades += await self._grade_batch(batch[k:k + CHUNK])
        except BaseException as e:  # never leave an episode waiting forever
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(e)
            raise
        for item, grade in zip(batch, grades):
            if not item.future.done():  # the episode may have been cancelled meanwhile
                item.future.set_result(grade)

    async def _grade_batch(self, items: list[_Item]) -> list[Grade]:
        args = [(i.gold, i.answer, i.expression) for i in items]
        results = await self._call(args, max(i.timeout for i in items))
        if results is not None:
            return [Grade(correct, parsed) for correct, parsed in results]
        if len(items) == 1:
            self.timeouts += 1
            return [Grade(False, False, timed_out=True)]
        return [(await self._grade_batch([item]))[0] for item in items]  # find the one that hangs

    async def _call(self, args: list[tuple[str, str, bool]], timeout: float) -> list | None:
        """One worker round trip; None when it ran past `timeout` (the worker is then replaced)."""
        loop = asyncio.get_running_loop()
        for _ in range(2):
            pool = self._ensure_pool()
            # Start-up (fork, imports, first parse) is not the answers' time: wait it out first.
            await asyncio.gather(*(asyncio.wrap_future(f) for f in self._warm))
            self.calls += 1
            try:
                return await asyncio.wait_for(loop.run_in_executor(pool, _grade_many, args), timeout)
            except asyncio.TimeoutError:
                self.restarts += 1
                self._kill(pool)
                return None
            except BrokenProcessPool:  # the worker died under us (killed, or out of memory): retry once
                self._kill(pool)
        return None

    # ------------------------------------------------------------------ processes
    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = _context()
            if context.get_start_method() == "fork":
                import math_verify  # noqa: F401  (imported once here, every forked worker inherits it)
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_worker_init)
            self._warm = [self._pool.submit(_ping) for _ in range(self.workers)]
        return self._pool

    def _kill(self, pool: ProcessPoolExecutor) -> None:
        """Kill the pool's processes now (a hung sympy call ignores everything gentler)."""
        if pool is not self._pool:
            return
        # ProcessPoolExecutor has no public kill before Python 3.14 (kill_workers); its
        # _processes map is the way to reach the workers.
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            if p.is_alive():
                p.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        for p in procs:
            p.join(timeout=5)
        self._pool, self._warm = None, []


_GRADER: Grader | None = None
_ALL: weakref.WeakSet = weakref.WeakSet()  # every grader, so that one call stops every worker


def shared_grader() -> Grader:
    """The process-wide grader every math env uses (started on first use)."""
    global _GRADER
    if _GRADER is None:
        _GRADER = Grader()
        atexit.register(shutdown_grader)
    return _GRADER


def shutdown_grader() -> None:
    """Stop the worker processes of every grader (the shared one, math_verify_call's, any other)."""
    for grader in list(_ALL):
        grader.shutdown()
