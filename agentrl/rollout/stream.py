"""Asynchronous rollout: groups are played in a background thread, ahead of training, within a
staleness bound (AReaL's asynchronous RL, in one process).

The engine, the collector and their event loop live in a thread of their own; the trainer
takes finished groups from it and pushes new weights to it. Three rules keep it safe:

- **Staleness bound.** Group n (the n-th group of the task source) may start only when
  `n < (v + k + 1) * G + replaced`, where v is the policy version the engine holds, k is
  `max_staleness`, G the groups per step and `replaced` the groups dropped so far as too stale
  or filtered out, whose places others take (a failed group keeps its place, as on-policy). A step
  trained at version v takes only groups whose oldest generated id has version >= v - k; older ones
  are dropped (counted as stale), so
  no sample used at step t comes from a policy older than t - k, even for an episode that spans
  a weight update (every generated id carries the version that produced it).
- **Streaming.** A step takes the groups in the order they finish; groups still playing serve
  a later step, within the bound.
- **A schedule of the config and seed, not of timing.** Groups start in batches: every group
  the bound allows is started at once, and the batch is played to its end before anything
  else changes what the engine does. What the trainer asks for that does (a weight push, places
  handed on by dropped groups, an evaluation, dropping cached prefixes) waits for the end of the
  batch in flight and is applied there, one request at a time, in the order the trainer made
  them. So every batch starts at a known policy version, is played alone (the engine's batches,
  the order its groups finish in, the ids they sample do not depend on how fast training runs),
  and a run gives the same groups, ids and values on every runtime that plays a batch the same
  way (the Ray runtime streams each env manager's finished groups back: runtime/ray/stream.py).
  Generation still overlaps training: the batch a weight push started plays while the trainer
  trains on the groups of the batch before it.

Resume rule: the checkpoint records which groups were consumed (a watermark plus the consumed
indices above it). A resumed run starts a fresh stream that skips those and regenerates every
other group from its task-source position with the restored policy: in-flight and ready groups
are not saved, they are played again (so k >= 1 keeps its invariants across a resume but does
not replay the exact same samples; k = 0 does not use this class and resumes exactly).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agentrl.llm.engine import InferenceEngine
from agentrl.rollout.collector import CollectResult, RolloutCollector
from agentrl.rollout.loop_thread import WATCH_SECONDS, LoopWatch
from agentrl.trajectory import Task, Trajectory


@dataclass
class ReadyGroup:
    """One finished group, as it came out of the collector."""

    index: int  # position in the task source
    trajectories: list[Trajectory]  # empty when the group was dropped for failures
    result: CollectResult  # counts and errors of the group's collection
    min_version: int | None  # oldest known policy version among the group's generated ids (None: none known)

    @property
    def failed(self) -> bool:
        """True when an episode ran out of retries (the group cannot be trained on)."""
        return not self.trajectories


def min_version(trajectories: list[Trajectory]) -> int | None:
    """The oldest policy version that produced any generated id of the trajectories; None when
    no id has a known one (a missing version, below 0, is unknown: neither old nor current)."""
    versions = [v for t in trajectories for v, m in zip(t.versions, t.loss_mask) if m and v >= 0]
    return min(versions) if versions else None


def generated_ids(trajectories: list[Trajectory]) -> int:
    """Generated ids of the trajectories (what a dropped group throws away)."""
    return sum(t.num_generated for t in trajectories)


def is_stale(group: ReadyGroup, oldest: int) -> bool:
    """Whether a finished group holds an id of a known version older than `oldest` (a failed
    group is not stale: it keeps its place; ids of unknown version are never judged)."""
    return not group.failed and group.min_version is not None and group.min_version < oldest


class RolloutStream:
    """Plays groups in a background event-loop thread and hands finished ones to the trainer."""

    def __init__(self, collector: RolloutCollector, engine: InferenceEngine, group_tasks: Callable[[int], list[Task]],
                 groups_per_step: int, max_staleness: int, version: int = 0,
                 consumed: dict[str, Any] | None = None, accept_stale: bool = True) -> None:
        self.collector = collector
        self.engine = engine  # the collector's engine: weights go to it between two of its steps
        self.group_tasks = group_tasks
        self.G = groups_per_step
        self.k = max_staleness
        # How far behind a taken group may be: k, or 0 when stale samples are dropped (they are
        # still generated ahead, and wasted, for runs that must stay strictly on-policy).
        self.max_lag = max_staleness if accept_stale else 0
        self.version = version  # policy version the engine holds (the loop thread's view)
        state = consumed or {"watermark": 0, "above": [], "replaced": 0}
        self._watermark = int(state["watermark"])  # every group below it was consumed
        self._consumed_above = set(state["above"])
        self._next = self._watermark
        self._replaced = int(state["replaced"])
        self._granted = self._replaced  # places handed on that the feeder has applied (at a batch's end)
        self._events: deque[Callable[[], Awaitable[None]]] = deque()  # the trainer's requests, for the feeder
        self._started = 0
        self._ready: list[ReadyGroup] = []
        self._stale_ids = 0  # generated ids of the groups dropped as too stale, since the last pop
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._thread = threading.Thread(target=self._run_loop, name="agentrl-rollout", daemon=True)
        self._error: BaseException | None = None
        self._blocked = False  # the loop was found blocked past the episode timeout: never join it

    # ------------------------------------------------------------------ trainer side
    def start(self) -> None:
        """Start the loop thread and the feeder."""
        self._thread.start()
        self.call(self._start_feeder)

    def take(self, n: int, version: int) -> tuple[list[ReadyGroup], int]:
        """Block until `n` groups are ready for a step trained at `version`; return them and the
        number dropped on the way as too stale (their places go to new groups).

        A group that failed counts as one of the `n`, as it does on-policy: the step trains on
        fewer groups rather than waiting for replacements of a broken env.
        """
        taken: list[ReadyGroup] = []
        stale = 0
        watch = LoopWatch(self.collector.timeout, f"a step has been waiting for {n} groups")
        with self._cond:
            while len(taken) < n:
                while not self._ready:
                    if self._error is not None:
                        raise self._error
                    self._cond.wait(timeout=WATCH_SECONDS)
                    self._check(watch)
                group = self._ready.pop(0)
                self._mark_consumed(group.index)
                if is_stale(group, version - self.max_lag):
                    stale += 1
                    self._stale_ids += generated_ids(group.trajectories)
                    self._replace(1)
                else:
                    taken.append(group)
        return taken, stale

    def pop_stale_ids(self) -> int:
        """Generated ids of the groups `take` dropped as too stale since the last call."""
        with self._cond:
            n, self._stale_ids = self._stale_ids, 0
            return n

    def replace(self, n: int) -> None:
        """Let `n` more groups start in place of taken ones the trainer filtered out."""
        with self._cond:
            self._replace(n)

    def load_weights(self, state_dict: dict) -> int:
        """Hand new weights to the engine; they apply at the end of the batch in flight (this
        blocks until then, so the caller may change its tensors afterwards); returns the new
        version."""
        async def apply() -> int:
            self.version = self.engine.load_weights(state_dict)
            return self.version
        return self.between_batches(apply)

    def between_batches(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run `await fn()` on the loop thread once the batch in flight has ended (after the
        requests made before it), and return its result: for what changes the engine's work."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        async def event() -> None:
            try:
                future.set_result(await fn())
            except BaseException as e:  # the caller's to raise
                future.set_exception(e)
        self.post(event)
        return self._wait(future, "the rollout thread has been busy with a batch of groups", feeder=True)

    def post(self, event: Callable[[], Awaitable[None]]) -> None:
        """Queue `await event()` for the end of the batch in flight, without waiting for it."""
        with self._cond:
            self._events.append(event)
        self._loop.call_soon_threadsafe(self._poke)

    def run(self, coro: Coroutine) -> Any:
        """Run a coroutine on the loop thread now, beside the batch in flight (what reads the
        engine and changes nothing it generates), and return its result."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return self._wait(future, "the rollout thread has been busy with a request")

    def _wait(self, future: concurrent.futures.Future, waiting: str, feeder: bool = False) -> Any:
        watch = LoopWatch(self.collector.timeout, waiting)
        while True:
            try:
                return future.result(timeout=WATCH_SECONDS)
            except concurrent.futures.TimeoutError:
                self._check(watch)
                if feeder and self._error is not None:  # the feeder stopped: nothing will run it
                    raise self._error from None

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the loop thread, between two event-loop steps, and return its result."""
        async def wrapper() -> Any:
            return fn()
        return self.run(wrapper())

    def state(self) -> dict[str, Any]:
        """The task-source position, for checkpoints: the groups below `watermark` and those in
        `above` were consumed; `replaced` counts the places dropped groups handed on."""
        with self._cond:
            return {"watermark": self._watermark, "above": sorted(self._consumed_above),
                    "replaced": self._replaced}

    def counts(self) -> dict[str, int]:
        """Groups started (since this stream began) and finished but not yet taken."""
        with self._cond:
            return {"started": self._started, "ready": len(self._ready)}

    def close(self) -> None:
        """Cancel what is in flight and stop the thread (a thread blocked by env code is left to
        die with the process: it is a daemon, and waiting on it would hang)."""
        if not self._thread.is_alive() or self._blocked:
            return
        async def cancel_all() -> None:
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.run(cancel_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _check(self, watch: LoopWatch) -> None:
        """As the on-policy collect does: env code that blocks the loop past the episode timeout
        ends the run in one line rather than hanging it."""
        try:
            watch.check(self._loop)
        except BaseException:
            self._blocked = True
            raise

    # ------------------------------------------------------------------ loop side
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _start_feeder(self) -> None:
        self._wake = asyncio.Event()
        self._spawn(self._feed())

    def _spawn(self, coro: Coroutine) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _feed(self) -> None:
        """Start every group the staleness bound allows as one batch and play it to its end; then
        apply the trainer's next request (waiting for one), and so on."""
        try:
            while True:
                with self._cond:
                    limit = (self.version + self.k + 1) * self.G + self._granted
                    starts = []
                    while self._next < limit:
                        if self._next not in self._consumed_above:
                            starts.append(self._next)
                        self._next += 1
                    self._started += len(starts)
                if starts:
                    await self._play(starts)
                    continue
                await (await self._next_event())()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # surface in the trainer thread rather than hang it
            self._fail(e)

    async def _next_event(self) -> Callable[[], Awaitable[None]]:
        assert self._wake is not None
        while True:
            with self._cond:
                if self._events:
                    return self._events.popleft()
            await self._wake.wait()
            self._wake.clear()

    async def _play(self, starts: list[int]) -> None:
        """Play groups `starts` together; each is ready as the collector hands it back."""
        groups = [self.group_tasks(n) for n in starts]
        astream = getattr(self.collector, "astream", None)  # a collector that plays batches itself (Ray's)
        played = astream(groups) if astream is not None else play_groups(self.collector, groups)
        try:
            async for i, result in played:
                group = ReadyGroup(starts[i], result.trajectories, result, min_version(result.trajectories))
                with self._cond:
                    self._ready.append(group)
                    self._cond.notify_all()
        finally:  # cancelled (the stream closes): the groups still playing stop now
            await played.aclose()

    def _fail(self, e: BaseException) -> None:
        with self._cond:
            self._error = e
            self._cond.notify_all()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ bookkeeping (under _cond)
    def _replace(self, n: int) -> None:
        self._replaced += n

        async def grant() -> None:
            with self._cond:
                self._granted += n
        self._events.append(grant)  # (the caller holds _cond)
        self._loop.call_soon_threadsafe(self._poke)

    def _mark_consumed(self, index: int) -> None:
        self._consumed_above.add(index)
        while self._watermark in self._consumed_above:
            self._consumed_above.discard(self._watermark)
            self._watermark += 1


async def play_groups(collector: RolloutCollector, groups: list[list[Task]],
                      first_attempt: int = 0) -> AsyncGenerator[tuple[int, CollectResult], None]:
    """Play `groups` together, each as a task of its own; yields (position in `groups`, result)
    in the order they finish (the stream's batch; an env manager's share of one on Ray)."""
    done: asyncio.Queue = asyncio.Queue()

    async def one(i: int, tasks: list[Task]) -> None:
        try:
            done.put_nowait((i, await collector.acollect(tasks, first_attempt), None))
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            done.put_nowait((i, None, e))
    running = [asyncio.get_running_loop().create_task(one(i, g)) for i, g in enumerate(groups)]
    try:
        for _ in groups:
            i, result, error = await done.get()
            if error is not None:
                raise error
            yield i, result
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
