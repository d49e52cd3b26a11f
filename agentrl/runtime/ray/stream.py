"""Asynchronous rollout on Ray (rollout.max_staleness=k >= 1): the local runtime's `StreamSource`
(rollout/source.py, rollout/stream.py) with the env managers as its collector and the engine
replicas as its engine, so the admission rule, the staleness drop, streaming and the resume rule
are the local ones, not a copy of them.

- `ManagerCollector` plays each group the stream starts on an env-manager actor (the one with
  the fewest groups in flight), awaited in the stream's event loop, so the managers keep playing
  groups ahead while rank 0 trains. A manager that dies costs its groups one attempt each and
  they are replayed once Ray has restarted it, as on-policy (`RaySource`'s job handling).
- `ReplicaEngine` is what the stream sees as its engine: a weight push goes to every replica
  (`EngineActor.load_weights` runs between two engine steps of the replica, so episodes in flight
  continue under the new weights and every generated id carries the version that produced it).

Everything that touches `RaySource`'s state runs in the stream's loop thread while the stream
runs (`StreamSource` routes engine calls there), so restarts are healed from one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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
        """The result of an env manager's call; meanwhile restarted replicas get the weights."""
        future = asyncio.wrap_future(ref.future())
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
        (perf/ only); False: there are none left here to drop."""
        self.source._on_engines("forget")
        return False

    def state_dict(self) -> dict[str, Any]:
        """Every replica's state (`RaySource.checkpoint`'s engine part)."""
        return self.source.checkpoint()["engine"]

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
