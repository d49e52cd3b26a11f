"""Asynchronous rollout on Ray (rollout.max_staleness=k >= 1): the local runtime's `StreamSource`
(rollout/source.py, rollout/stream.py) with the env managers as its collector and the engine
replicas as its engine, so the admission rule, the staleness drop, streaming, the schedule and
the resume rule are the local ones, not a copy of them.

- `ManagerCollector.astream` plays each batch of groups the stream starts as one call per env
  manager (contiguous blocks, as on-policy), a Ray streaming generator that hands each group
  back as it ends; the groups are consumed in a fixed order (the managers in turn, each in the
  order its groups ended), awaited in the stream's event loop, so the managers keep playing
  ahead while rank 0 trains. A batch starts with every manager idle and nothing else reaches the
  engines while it plays (the stream applies weight pushes, evaluations and the rest between
  two batches), so with one env manager and one replica each group is played as the local run
  plays it: the same engine batches, the same finishing order, the same values; with more, the
  schedule is still a function of the config and seed. Between two batches is also where
  engine replicas are added or removed as the run folder asks (`agentrl scale`,
  runtime/ray/elastic.py), as on-policy runs do at a step boundary. A manager that dies costs the groups it
  had not handed back one attempt each, and they are replayed once Ray has restarted it, as
  on-policy (`RaySource`'s job handling).
- `ReplicaEngine` is what the stream sees as its engine: a weight push goes to every replica
  (between two batches: no episode is in flight) and every generated id carries the version that
  produced it.

Everything that touches `RaySource`'s state runs in the stream's loop thread while the stream
runs (`StreamSource` routes engine calls there), so restarts are healed from one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from agentrl.rollout.collector import CollectResult
from agentrl.rollout.source import StreamSource
from agentrl.runtime.ray.source import POLL, RaySource, _Job, split_groups
from agentrl.trajectory import Task


class ManagerCollector:
    """The stream's collector: groups played by env-manager actors."""

    def __init__(self, source: RaySource, timeout: float | None) -> None:
        self.source = source
        self.timeout = timeout  # the episode timeout (the stream's watch on its loop reads it)
        self.busy = [0] * len(source.managers)  # groups in flight per env manager
        self._healed = 0.0  # when restarted replicas were last looked for

    def collect(self, tasks: list[Task]) -> CollectResult:
        """Play `tasks` now (before the stream starts: the first evaluation)."""
        return self.source._play(tasks)

    async def acollect(self, tasks: list[Task]) -> CollectResult:
        """Play `tasks` (whole groups) on the env managers; results joined in task order. One
        group goes to the least busy manager; more (an evaluation) are split as on-policy."""
        live = self.source._live_managers()
        shares = [(m, block) for m, block in zip(live, split_groups(tasks, len(live))) if block]
        if len(shares) == 1:
            shares = [(min(live, key=lambda m: self.busy[m]), shares[0][1])]
        results = await asyncio.gather(*(self._job(_Job(m, block)) for m, block in shares))
        total = CollectResult([])
        for result in results:
            total.absorb(result)
            total.trajectories += result.trajectories
        return total

    async def astream(self, groups: list[list[Task]]) -> AsyncIterator[tuple[int, CollectResult]]:
        """Play a batch of groups on the env managers; yields (position in `groups`, result) in a
        fixed order: the first group each manager finished, in manager order, then the second..."""
        if self.source.elastic is not None:  # every manager is idle and no episode in flight: the boundary
            self.source.elastic.at_boundary()
        live = self.source._live_managers()
        n = len(groups)
        blocks = [list(range(k * n // len(live), (k + 1) * n // len(live))) for k in range(len(live))]
        shares = [(m, block) for m, block in zip(live, blocks) if block]
        queues: list[asyncio.Queue] = [asyncio.Queue() for _ in shares]
        loop = asyncio.get_running_loop()
        running = [loop.create_task(self._stream_job(m, [(i, groups[i]) for i in block], q))
                   for (m, block), q in zip(shares, queues)]
        try:
            for rank in range(max(len(block) for _, block in shares)):
                for (_, block), q in zip(shares, queues):
                    if rank < len(block):
                        item = await q.get()
                        if isinstance(item, BaseException):
                            raise item
                        yield item
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _stream_job(self, manager: int, items: list[tuple[int, list[Task]]], out: asyncio.Queue) -> None:
        """One manager's share of a batch, each group put in `out` as it ends, through deaths and
        restarts (the groups not handed back yet lose one attempt per death)."""
        import ray

        pending = list(items)  # (position in the batch, tasks) not handed back yet
        job = _Job(manager, [t for _, g in pending for t in g], groups=[g for _, g in pending])
        carried = 0  # episodes of the lost attempts' counts in job.result (each episode counts once)
        try:
            self.source._submit(job)
            while pending:
                sent = list(pending)
                try:
                    while pending:
                        ref = await self._wait(job.ref.__anext__())
                        j, result = await self._wait(ref)
                        i, _ = sent[j]
                        pending.remove(sent[j])
                        if job.result is not None:  # the attempts lost before count too (once)
                            result.absorb(job.result)
                            result.episodes -= carried
                            job.result = None
                        out.put_nowait((i, result))
                    job.ref = None
                except StopAsyncIteration:  # (a manager ends its generator once every group is back)
                    job.ref = None
                except ray.exceptions.RayActorError as e:
                    job.ref = None
                    job.tasks = [t for _, g in pending for t in g]
                    job.groups = [g for _, g in pending]
                    carried = len(job.tasks)
                    self.source._lost(job, e)
                    while job.deadline:  # waiting for Ray to restart it (or giving up)
                        await asyncio.sleep(POLL)
                        self.source._retry_when_back(job)
                    if job.ref is None:  # given up: the groups left fail whole
                        assert job.result is not None
                        for k, (i, _) in enumerate(pending):
                            out.put_nowait((i, job.result if k == 0 else CollectResult([])))
                        return
        except asyncio.CancelledError:  # the stream closes: stop the actor's work on it too
            if job.ref is not None:
                with contextlib.suppress(Exception):
                    ray.cancel(job.ref)
            raise
        except BaseException as e:  # the stream's feeder raises it
            out.put_nowait(e)

    async def _job(self, job: _Job) -> CollectResult:
        """One manager's share, through deaths and restarts (one attempt lost per death)."""
        import ray

        self.busy[job.manager] += 1
        try:
            self.source._submit(job)
            while job.ref is not None:
                ref = job.ref
                try:
                    result = await self._wait(ref)
                except ray.exceptions.RayActorError as e:
                    job.ref = None
                    self.source._lost(job, e)
                    while job.deadline:  # waiting for Ray to restart it (or giving up)
                        await asyncio.sleep(POLL)
                        self.source._retry_when_back(job)
                    continue
                job.ref = None
                self.source._finish(job, result)
            assert job.result is not None
            return job.result
        except asyncio.CancelledError:  # the stream closes: stop the actor's work on it too
            if job.ref is not None:
                with contextlib.suppress(Exception):
                    ray.cancel(job.ref)
            raise
        finally:
            self.busy[job.manager] -= 1

    async def _wait(self, ref: Any) -> Any:
        """The result of an env manager's call (an object ref, or an awaitable); meanwhile
        restarted replicas get the weights."""
        future = asyncio.ensure_future(ref) if not hasattr(ref, "future") else asyncio.wrap_future(ref.future())
        # Read its error even when nobody waits any more (a cancelled collect, as the stream closes).
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        while True:
            done, _ = await asyncio.wait({future}, timeout=POLL)
            if done:
                return future.result()
            if time.monotonic() - self._healed > POLL:
                self._healed = time.monotonic()
                self.source._heal_engines()


class ReplicaEngine:
    """The engine replicas as the stream's engine: weights, version, counters and state of all."""

    def __init__(self, source: RaySource) -> None:
        self.source = source

    @property
    def policy_version(self) -> int:
        """Version of the weights the replicas serve."""
        return self.source.policy_version

    def load_weights(self, weights: dict[str, Any]) -> int:
        """Push to every replica (each applies them between two of its engine steps)."""
        return self.source.load_weights(weights)

    def pop_metrics(self) -> dict[str, float]:
        """The replicas' counters, weight sync and restarts (`RaySource.pop_metrics`)."""
        return self.source.pop_metrics()

    def reset_prefix_cache(self) -> bool:
        """Every replica forgets its cached prefixes, and the counters of the work they held
        (perf/ only); False: there are none left here to drop. Served engines: the servers drop
        theirs, as the local run's engine on them does (True: their counters are to be popped)."""
        if self.source.served is not None:
            return bool(self.source.served.engine.reset_prefix_cache())
        self.source._on_engines("forget")
        return False

    def state_dict(self) -> dict[str, Any]:
        """Every replica's state (`RaySource.checkpoint`'s engine part), cached prefixes kept (the
        stream drops them between two batches)."""
        if self.source.served is not None:
            return self.source.served.state_dict()
        states = self.source._on_engines("state", False)
        return {**states[0], "replicas": states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every replica continues from its state in `state`."""
        self.source.restore({"engine": state, "stream": None})

    def close(self) -> None:
        """The actors are the runtime's to stop."""


def ray_stream_source(source: RaySource, max_staleness: int, episode_timeout: float | None,
                      accept_stale: bool) -> StreamSource:
    """The local stream over `source`'s env managers and engine replicas."""
    # Duck-typed: the stream calls only acollect/collect/timeout and the engine methods above.
    collector: Any = ManagerCollector(source, episode_timeout)
    engine: Any = ReplicaEngine(source)
    return StreamSource(collector, engine, source.tasks, max_staleness, accept_stale)
