"""The third `RolloutSource` (rollout/source.py): episodes played by env-manager actors against
engine-replica actors, on-policy. It runs in trainer rank 0, where the weights are.

A step's groups are split between the env managers in contiguous blocks (group g of G goes to
manager g * M // G), each manager plays its block with the collector, and the results are
joined in group order: with one manager and one replica the trainer sees exactly what the local
runtime's `OnPolicySource` gives it.

Faults. An env manager that dies takes its episodes with it: each counts one failed attempt
(kind `worker`), and once Ray has restarted the actor its tasks are played again as their next
attempt (rollout.max_retries; when none is left their groups are dropped whole). An engine
replica that dies fails the requests it held (the collector retries those episodes as engine
errors); once restarted it waits, serving nothing, until this source has given it the current
weights, which it checks for while it waits on the env managers.

Served engines (engine.kind=remote / vllm, runtime/ray/served.py): the env managers generate on
inference servers, and this source pushes weights, checkpoints and heals through `served`, the
engine the local runtime would build on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.errors import RolloutError
from agentrl.rollout.collector import CollectResult
from agentrl.rollout.filters import Groups, groups_of
from agentrl.rollout.source import GroupFilter, StepRollout, fill_step
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.assembly.rollout import task_source
from agentrl.runtime.ray.engine_client import first_line
from agentrl.runtime.ray.served import ServedEngine
from agentrl.runtime.ray.weight_sync import WeightPayload, make_transport, split_meta
from agentrl.trajectory import Task

POLL = 0.25  # seconds between checks on restarted actors while episodes play
RATE_KEYS = ("per_s", "rate", "mean")  # engine metrics that are averaged over replicas, not summed


def split_groups(tasks: list[Task], parts: int) -> list[list[Task]]:
    """`tasks` (whole groups, in order) as `parts` contiguous blocks of groups (some may be empty)."""
    groups: list[list[Task]] = []
    for t in tasks:
        if not groups or groups[-1][-1].group_id != t.group_id:
            groups.append([])
        groups[-1].append(t)
    n = len(groups)
    return [[t for g in groups[k * n // parts:(k + 1) * n // parts] for t in g] for k in range(parts)]


def merge_engine_metrics(per_replica: list[dict[str, float]]) -> dict[str, float]:
    """Counts summed over replicas, rates and means averaged."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for m in per_replica for k in m):
        values = [m[key] for m in per_replica if key in m]
        out[key] = sum(values) / len(values) if key.endswith(RATE_KEYS) else sum(values)
    return out


@dataclass
class _Job:
    """One env manager's share of a collection."""

    manager: int
    tasks: list[Task]
    attempt: int = 0  # first attempt to play (> 0 after the manager died with them)
    result: CollectResult | None = None  # counts of the attempts lost with a dead manager
    ref: Any = None
    deadline: float = 0.0  # while waiting for a restart
    groups: list[list[Task]] | None = None  # streamed: the groups of `tasks`, each handed back as it ends


class RaySource:
    """On-policy groups played by env-manager actors; weights pushed to every engine replica."""

    def __init__(self, run_plan: RunPlan, weights: Callable[[], dict[str, Any]], engines: list[Any],
                 engine_names: list[str], managers: list[Any], transport: str, weights_dir: str,
                 served: ServedEngine | None = None) -> None:
        import ray

        self.runtime = run_plan.runtime
        self.tasks = task_source(run_plan)
        self.engines, self.engine_names, self.managers = engines, engine_names, managers
        self.current_weights = weights  # the weights the engines should serve (rank 0's model)
        self.transport = make_transport(transport, weights_dir)
        self.fallback = make_transport("object_store")  # for a restarted replica, and after a broadcast broke
        self.max_retries = run_plan.rollout.max_retries
        self.restart_timeout = run_plan.runtime.restart_timeout
        self.served = served  # engine.kind=remote / vllm: the servers, driven from here (runtime/ray/served.py)
        self._version = served.policy_version if served is not None else ray.get(engines[0].info.remote())["version"]
        self._synced = False  # whether any update has reached the engines (else a restarted one is current)
        self._stats = dict.fromkeys(("sync_seconds", "sync_bytes", "engine_restarts", "manager_restarts"), 0.0)
        self._gone: set[int] = set()  # env managers that died for good: later steps split among the rest
        self._down: set[int] = set()  # env managers seen dead and not yet seen back: one restart each
        self.elastic: Any = None  # runtime/ray/elastic.py: replicas added or removed at step boundaries
        self.most_engines = len(engines)  # the most replicas at once since the metrics were last read

    @property
    def policy_version(self) -> int:
        """Version of the weights the engines serve."""
        return self._version

    def use_transport(self, transport: Any) -> None:
        """Send weights through `transport` (a broadcast group rank 0 has joined)."""
        self.transport = transport

    # ------------------------------------------------------------------ RolloutSource
    def start(self) -> None:
        """Nothing plays ahead on-policy."""

    def collect(self, step: int, version: int, keep: GroupFilter | None = None, max_batches: int = 1) -> StepRollout:
        """Fresh generation batches of the step's tasks, played by the env managers."""
        if self.elastic is not None:  # the step boundary: no episode in flight
            self.elastic.at_boundary()
        def next_batch(attempt: int) -> tuple[Groups, CollectResult, int]:
            result = self._play(self.tasks.step(step, attempt))
            return groups_of(result.trajectories), result, 0
        return fill_step(next_batch, self.tasks.n_groups, keep, max_batches, on_played=self.tasks.observe,
                         version=version)

    def evaluate(self) -> CollectResult:
        """Play the evaluation tasks, then make every replica forget them."""
        result = self._play(self.tasks.evaluation())
        if self.served is not None:
            self.served.forget()
        else:
            self._on_engines("forget")
        return result

    def load_weights(self, weights: dict[str, Any]) -> int:
        """Send the new weights to every replica; returns the new policy version."""
        if self.served is not None:
            self._version = self.served.load_weights(weights, self._version + 1)
            return self._version
        self._push(list(range(len(self.engines))), weights, self._version + 1, self.transport)
        self._version += 1
        self._synced = True
        return self._version

    def pop_metrics(self) -> dict[str, float]:
        """The replicas' perf/engine_* counters, the weight sync's time and size, restarts."""
        per_replica = [] if self.served is not None else self._on_engines("pop_metrics")
        out = self.served.pop_metrics() if self.served is not None else merge_engine_metrics(per_replica)
        s = self._stats
        if s["sync_bytes"]:
            out["perf/weight_sync_seconds"] = s["sync_seconds"]
            out["perf/weight_sync_mb"] = s["sync_bytes"] / 2**20
        out["perf/ray_restarts_engine"] = s["engine_restarts"]
        out["perf/ray_restarts_env_manager"] = s["manager_restarts"]
        if per_replica:  # (served engines: replicas of theirs, not these)
            out["ray/engine_replicas"] = float(len(self.engines))
            # An asynchronous run adds and removes replicas between batches, several of which may
            # play between two reads: the most there were, so that none goes unseen.
            out["ray/engine_replicas_max"] = float(max(self.most_engines, len(self.engines)))
            self.most_engines = len(self.engines)
            # A replica that served nothing this step shows as 0 (say, more replicas than episodes).
            out["ray/engine_requests_min"] = min(m.get("perf/engine_requests", 0.0) for m in per_replica)
        self._stats = dict.fromkeys(self._stats, 0.0)
        return out

    def checkpoint(self) -> dict[str, Any]:
        """Every replica's state (replica 0's also as the one-engine state a local run reads)."""
        if self.served is not None:
            return {"engine": self.served.state_dict(), "stream": None}
        states = self._on_engines("state")
        return {"engine": {**states[0], "replicas": states}, "stream": None}

    def restore(self, state: dict[str, Any]) -> None:
        """Each replica continues from its own state (a checkpoint of fewer replicas: replica 0's)."""
        import ray

        engine = state["engine"]
        if self.served is not None:
            self.served.load_state_dict(engine)
            self._version = self.served.policy_version
            return
        replicas = engine.get("replicas") or [engine]
        self._on_engines("needs_weights")  # every replica up
        ray.get([e.restore.remote({k: v for k, v in replicas[i if i < len(replicas) else 0].items()
                                   if k != "replicas"}) for i, e in enumerate(self.engines)])
        self._version = int(engine["policy_version"])

    def _on_engines(self, method: str, *args: Any) -> list[Any]:
        """`method` of every replica, once each is up and serves the current weights (a restarted
        one is given them first; one that will not come back is an error)."""
        import ray

        deadline = time.monotonic() + self.restart_timeout
        while True:
            self._heal_engines()
            refs = [getattr(e, method).remote(*args) for e in self.engines]
            try:
                return ray.get(refs)
            except ray.exceptions.ActorDiedError as e:
                raise RolloutError(f"an engine replica died and will not restart (runtime.max_restarts="
                                   f"{self.runtime.max_restarts}): {first_line(e)}") from None
            except ray.exceptions.RayActorError as e:
                if time.monotonic() > deadline:
                    raise RolloutError(f"an engine replica did not come back within runtime.restart_timeout="
                                       f"{self.restart_timeout}s: {first_line(e)}") from None
                time.sleep(POLL)

    def close(self) -> None:
        """The actors are the runtime's to stop."""

    def shutdown(self) -> None:
        """The actors are the runtime's to stop."""

    # ------------------------------------------------------------------ playing
    def _play(self, tasks: list[Task]) -> CollectResult:
        """Play `tasks` on the env managers; their results joined in task order."""
        live = self._live_managers()
        jobs = [_Job(m, block) for m, block in zip(live, split_groups(tasks, len(live))) if block]
        for job in jobs:
            if job.manager in self._down:  # still restarting: wait for it rather than lose an attempt
                job.deadline = time.monotonic() + self.restart_timeout
            else:
                self._submit(job)
        while any(job.ref is not None or job.deadline for job in jobs):
            self._step_jobs(jobs)
            self._heal_engines()
        total = CollectResult([])
        for job in jobs:
            assert job.result is not None  # the loop ends once every job is played or given up: each has one
            total.absorb(job.result)
            total.trajectories += job.result.trajectories
        return total

    def _live_managers(self) -> list[int]:
        """The env managers that may still play (one that died for good is left out)."""
        live = [m for m in range(len(self.managers)) if m not in self._gone]
        if not live:
            raise RolloutError("every env manager died and none came back (runtime.max_restarts="
                               f"{self.runtime.max_restarts}); the run cannot play episodes")
        return live

    def _submit(self, job: _Job) -> None:
        if self.served is not None:  # its client stamps ids with it where the servers do not (called in order)
            self.managers[job.manager].set_policy_version.remote(self._version, self.served.request_model())
        manager = self.managers[job.manager]
        if job.groups is not None:  # runtime/ray/stream.py: a generator of (position, result)
            job.ref = manager.play_groups.options(num_returns="streaming").remote(job.groups, job.attempt)
        else:
            job.ref = manager.collect.remote(job.tasks, job.attempt)
        job.deadline = 0.0

    def _step_jobs(self, jobs: list[_Job]) -> None:
        """Wait a little for results; handle dead and restarted env managers."""
        import ray

        running = [job.ref for job in jobs if job.ref is not None]
        ready = set(ray.wait(running, num_returns=len(running), timeout=POLL)[0]) if running else set()
        if not running:
            time.sleep(POLL)
        for job in jobs:
            if job.ref is not None and job.ref in ready:
                ref, job.ref = job.ref, None
                try:
                    self._finish(job, ray.get(ref))
                except ray.exceptions.RayActorError as e:
                    self._lost(job, e)
            elif job.deadline:
                self._retry_when_back(job)

    def _finish(self, job: _Job, result: CollectResult) -> None:
        if job.result is not None:  # the attempts lost before count too
            result.absorb(job.result)
            result.episodes -= len(job.tasks)  # each episode was asked for once
        job.result = result

    def _lost(self, job: _Job, error: Exception) -> None:
        """The env manager died with `job`'s episodes: one failed attempt each, then a replay."""
        lost = CollectResult([], episodes=len(job.tasks))
        name = f"env manager {job.manager}"
        lost.failures["worker"] = len(job.tasks)
        lost.errors = [f"worker: {name} died: {first_line(error)} (env seed {t.env_seed}, attempt {job.attempt + 1})"
                       for t in job.tasks]
        if job.result is not None:
            lost.absorb(job.result)
            lost.episodes -= len(job.tasks)
        job.result = lost
        job.attempt += 1
        if isinstance(error, _permanent()):
            self._gone.add(job.manager)
        elif job.manager not in self._down:  # one restart per death, however many calls report it
            self._down.add(job.manager)
            self._stats["manager_restarts"] += 1
        if job.attempt > self.max_retries or job.manager in self._gone:
            self._give_up(job)
        else:
            job.deadline = time.monotonic() + self.restart_timeout

    def _retry_when_back(self, job: _Job) -> None:
        import ray

        try:
            ray.get(self.managers[job.manager].info.remote(), timeout=POLL)
        except ray.exceptions.ActorDiedError:
            self._gone.add(job.manager)
            self._give_up(job)
            return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > job.deadline:
                self._give_up(job)
            return
        self._down.discard(job.manager)
        if self.elastic is not None:  # restarted with the replica list it was first given
            self.elastic.manager_back(job.manager)
        self._submit(job)

    def _give_up(self, job: _Job) -> None:
        """Every episode of the job failed for good: its groups are dropped."""
        if job.result is None:  # never played: its manager stayed down past the restart timeout
            job.result = CollectResult([], episodes=len(job.tasks))
            job.result.failures["worker"] = len(job.tasks)
            job.result.errors = [f"worker: env manager {job.manager} did not come back within "
                                 f"runtime.restart_timeout={self.restart_timeout}s (env seed {t.env_seed})"
                                 for t in job.tasks]
        result = job.result
        result.failed_episodes += len(job.tasks)
        result.dropped_groups += len({t.group_id for t in job.tasks})
        job.deadline = 0.0

    # ------------------------------------------------------------------ weights
    def _heal_engines(self) -> None:
        """Give restarted replicas the current weights (they serve nothing until then)."""
        import ray

        if self.served is not None:
            self.served.heal()
            return

        refs = [e.needs_weights.remote() for e in self.engines]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=POLL)[0])
        stale = []
        for i, ref in enumerate(refs):
            if ref in ready:
                try:
                    if ray.get(ref):
                        stale.append(i)
                except ray.exceptions.RayActorError:
                    pass  # restarting: next time
        if not stale:
            return
        if self.transport.name == "broadcast":  # the group lost a member: it cannot broadcast again
            self.transport = self.fallback
        self._stats["engine_restarts"] += len(stale)
        self.bring_up_to_date(stale)

    def bring_up_to_date(self, indices: list[int]) -> None:
        """Give replicas `indices` (restarted, or new: elastic.py) the current weights and version."""
        import ray

        if not self._synced:  # no update yet: the constructor's weights are current
            got = ray.get([self.engines[i].accept_initial.remote() for i in indices])
            assert all(v == self._version for v in got), f"replicas at versions {got}, the run at {self._version}"
            return
        self._push(indices, self.current_weights(), self._version, self.fallback)

    def _push(self, indices: list[int], weights: dict[str, Any], version: int, transport: Any) -> None:
        """Send `weights` at `version` to the replicas `indices`; a replica that dies meanwhile is
        given them again once Ray has restarted it (`_heal_engines`)."""
        import ray

        t0 = time.perf_counter()
        weights, meta = split_meta(weights)  # with LoRA: the adapter tensors, and its config beside them
        payload: WeightPayload = transport.send(weights, version)
        payload.meta = meta
        refs = [self.engines[i].load_weights.remote(payload) for i in indices]
        try:
            if transport.name == "broadcast":
                transport.broadcast(weights)
            for ref in refs:
                try:
                    got = ray.get(ref, timeout=self.runtime.collective_timeout)
                except ray.exceptions.RayActorError:
                    continue  # restarting: it waits for weights, and gets them then
                if got != version:
                    raise RolloutError(f"an engine replica reports policy version {got} after a weight push of "
                                       f"version {version}")
        finally:
            transport.release(payload)
        self._stats["sync_seconds"] += time.perf_counter() - t0
        self._stats["sync_bytes"] += payload.nbytes * len(indices)


def _permanent() -> type:
    import ray

    return ray.exceptions.ActorDiedError
