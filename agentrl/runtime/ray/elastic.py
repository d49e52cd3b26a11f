"""Elastic rollout: engine replicas added to or removed from a Ray run while it trains.

The user asks through the run folder (runtime/ray/scale_file.py: `agentrl scale RUN_DIR engines=N`,
`RayRun.scale(n)`); trainer rank 0 applies the request at the start of a step's collection, the
step boundary where on-policy no episode is in flight, before any episode of the step starts (an
asynchronous run, rollout.max_staleness >= 1: before each batch of groups the stream starts,
when every env manager is idle; runtime/ray/stream.py):

- Growing. Replica i goes back into its own bundle of the run's placement group when i <
  runtime.actor_infer.world_size (one removed earlier left it reserved), else into a placement
  group of its own, one bundle of the role's size (the engine's CPUs, or one whole GPU for a role
  on GPUs), waited for at most runtime.placement_timeout. Not spare bundles reserved up front:
  they would hold capacity idle the whole run, and could never use a node that joins later. The
  new replica is built from the same spec and model as the others (seed as the driver gives
  replica i) and is sent the current weights and policy version (by the object store, as a
  restarted replica is) before any env manager knows of it. One that cannot be placed or fails
  to start is logged and left out, and that request is not tried again: the step goes on with
  the replicas there are. A replica beyond the run's bundles that would reserve nothing
  (runtime.actor_infer.num_cpus=0 on CPU) is not started at all (`growth`, logged once per
  request): nothing would bound how many the cluster takes. A request asks at most
  MAX_ENGINES (scale_file.py).
- Shrinking removes the highest-numbered replicas. The env managers are re-bound first, so
  nothing new reaches them; each is then killed once it holds no request (at a step boundary it
  holds none; after runtime.restart_timeout it is killed anyway: its episodes fail as engine
  errors and are retried, counted in rollout/failures_engine), and its own placement group removed.
- Every env manager is re-bound to its share of the new list (driver.bound_engines); one that
  Ray restarts later is re-bound before it plays again (its constructor has the first list).

A broadcast group (weight_sync nccl) cannot grow or shrink: after the first change weights go by
the object store, as do those of `shm` while a replica sits off rank 0's node. The count is logged
as ray/engine_replicas at every step, and the most there were since the previous step as
ray/engine_replicas_max (runtime/ray/source.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from agentrl.runtime.ray.engine_client import first_line
from agentrl.runtime.ray.placement import Worker, bound_engines, options, replica_seed
from agentrl.runtime.ray.scale_file import MAX_ENGINES, read_request
from agentrl.runtime.ray.workers import node_id

DRAIN_POLL = 0.1  # seconds between checks on a replica being removed


def replica_bundle(num_cpus: float, on_gpu: bool) -> dict[str, float]:
    """What a replica placed outside the run's placement group reserves: the engine's CPUs, and
    one whole GPU for a role on GPUs (empty: nothing)."""
    bundle = {"CPU": num_cpus, **({"GPU": 1.0} if on_gpu else {})}
    return {k: v for k, v in bundle.items() if v > 0}


def growth(have: int, wanted: int, placed: int, bundle: dict[str, float]) -> tuple[int, str | None]:
    """How many replicas a request for `wanted` may grow the run to from `have` (`placed`: the
    replicas the run's placement group holds bundles for; `bundle`: what one more beyond them
    reserves), and why it stops short of `wanted` before asking the cluster (None: it does not).
    A replica that reserves nothing is never refused by the cluster: it is not started."""
    wanted = min(wanted, MAX_ENGINES)
    reach = max(have, placed)
    if bundle or wanted <= reach:
        return wanted, None
    return reach, (f"engine-{reach} would reserve no resources (runtime.actor_infer.num_cpus=0 on CPU, beyond the "
                   f"{placed} placed), so nothing bounds how many the cluster takes: not started; staying at "
                   f"{reach} replicas (set runtime.actor_infer.num_cpus > 0 to add replicas)")


@dataclass
class ElasticSpec:
    """What trainer rank 0 needs to create engine replicas as the driver did."""

    shared: Any  # the run's SharedSpec
    pg: Any  # the run's placement group
    infer: list[Worker]  # actor_infer's workers of the placement, by index
    prefix: str  # the run's actor-name prefix
    seed: int
    api_key: str | None  # runtime.engine_transport=http
    max_restarts: int
    run_dir: str
    placement_timeout: float
    on_gpu: bool  # actor_infer is placed on GPUs


class ElasticEngines:
    """Trainer rank 0's side: applies the run folder's scale request to a `RaySource`."""

    def __init__(self, spec: ElasticSpec, source: Any, log: Callable[[str], None]) -> None:
        self.spec, self.source, self.log = spec, source, log
        self.groups: list[Any] = [None] * len(source.engines)  # each replica's own placement group (None: the run's)
        self.generation = 0  # actor names stay unique while a killed replica's name is released
        self.failed: str | None = None  # id of a request that could not be met: not tried every step
        self.changed = False  # the replica list differs from the one env managers were built with
        self.home: Any = None  # the run's own weight transport, once a change may have replaced it

    # ------------------------------------------------------------------ the boundary
    def at_boundary(self) -> None:
        """Apply the run folder's request, if it asks for another count."""
        try:
            request = read_request(self.spec.run_dir)
        except ValueError as e:
            request = None
            if self.failed != str(e):
                self.failed = str(e)
                self.log(f"elastic: {e}")
        if request is None or request[0] == self.failed or request[1] == len(self.source.engines):
            return
        rid, wanted = request
        before = len(self.source.engines)
        if wanted > before:
            self._grow(wanted)
        else:
            self._shrink(wanted)
        now = len(self.source.engines)
        self.source.most_engines = max(self.source.most_engines, now)
        if now != wanted:
            self.failed = rid
        if now != before:
            self.changed = True
            if now > before:  # shrinking re-bound them before draining
                self._rebind(range(len(self.source.managers)))
            self._check_transport()
        self.log(f"elastic: {before} -> {now} engine replicas" + ("" if now == wanted else f" (asked {wanted})"))

    def manager_back(self, manager: int) -> None:
        """Env manager `manager` was restarted by Ray: bind it to the current replicas before it plays."""
        if self.changed:
            self._rebind([manager])

    # ------------------------------------------------------------------ growing
    def _grow(self, wanted: int) -> None:
        """Start replicas len(engines)..wanted-1 at once; keep, in order, those that started."""
        import ray

        spec = self.spec
        first, created = len(self.source.engines), []
        reach, why = growth(first, wanted, len(spec.infer), replica_bundle(spec.infer[0].num_cpus, spec.on_gpu))
        if why is not None:
            self.log(f"elastic: {why}")  # once: a request that is not met is not tried again
        for i in range(first, reach):
            made = self._create(i)
            if made is None:
                break
            created.append(made)
        infos = [handle.info.remote() for handle, _ in created]  # every model loads meanwhile
        for k, ((handle, group), ref) in enumerate(zip(created, infos)):
            i = first + k
            try:
                ray.get(ref)
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                self.log(f"elastic: engine-{i} did not start, staying at {i} replicas: {first_line(e)}")
                for later in created[k:]:  # replica indices stay contiguous
                    self._discard(*later)
                return
            self.source.engines = [*self.source.engines, handle]
            self.source.engine_names = [*self.source.engine_names, f"engine-{i}"]
            self.groups.append(group)
            try:  # the current weights and version before any env manager can reach it
                self.source.bring_up_to_date([i])
            except Exception:
                for later in created[k + 1:]:
                    self._discard(*later)
                self._remove(i)
                raise

    def _create(self, i: int) -> tuple[Any, Any] | None:
        """Replica i's actor (loading its model) and its own placement group, if any; None
        (logged) when it cannot be placed."""
        import ray

        from agentrl.runtime.ray.engine_actor import EngineActor

        spec, group = self.spec, None
        if i < len(spec.infer):
            worker, pg = spec.infer[i], spec.pg
        else:
            worker, group = self._own_group(i)
            if group is None and worker.bundle is not None:
                return None
            pg = group
        self.generation += 1
        handle = ray.remote(EngineActor).options(
            name=f"{spec.prefix}engine-{i}.{self.generation}", **options(worker, pg),
            max_restarts=spec.max_restarts, max_task_retries=0,
        ).remote(spec.shared, i, replica_seed(spec.seed, i), spec.api_key)
        return handle, group

    def _own_group(self, i: int) -> tuple[Worker, Any]:
        """A worker of the role's size for replica i, in a placement group of its own (placed
        within runtime.placement_timeout, else None, logged)."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        spec, like = self.spec, self.spec.infer[0]
        bundle = replica_bundle(like.num_cpus, spec.on_gpu)
        worker = replace(like, index=i, gpu=None, gpu_share=1.0 if spec.on_gpu else 0.0,
                         bundle=0 if bundle else None)
        if not bundle:  # reserves nothing: placed anywhere, as the driver places such a worker
            return worker, None
        group = placement_group([bundle], name=f"{spec.prefix}engine-{i}.{self.generation + 1}")
        try:
            ray.get(group.ready(), timeout=spec.placement_timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            free = {k: round(v, 3) for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
            self.log(f"elastic: the cluster did not place engine-{i} ({bundle}) within runtime.placement_timeout="
                     f"{spec.placement_timeout:g}s (free now: {free}); staying at {i} replicas")
            return worker, None
        return worker, group

    # ------------------------------------------------------------------ shrinking
    def _shrink(self, wanted: int) -> None:
        gone = list(range(wanted, len(self.source.engines)))
        handles = self.source.engines[wanted:]
        self.source.engines = self.source.engines[:wanted]
        self.source.engine_names = self.source.engine_names[:wanted]
        groups, self.groups = self.groups[wanted:], self.groups[:wanted]
        self._rebind(range(len(self.source.managers)))  # nothing new reaches them from here on
        for i, handle, group in zip(gone, handles, groups):
            self._drain(i, handle)
            self._discard(handle, group)

    def _drain(self, i: int, handle: Any) -> None:
        """Until replica i holds no request (or runtime.restart_timeout has passed)."""
        import ray

        deadline = time.monotonic() + self.source.restart_timeout
        while time.monotonic() < deadline:
            try:
                if not ray.get(handle.busy.remote(), timeout=self.source.restart_timeout):
                    return
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return  # dead or restarting: it holds nothing worth waiting for
            time.sleep(DRAIN_POLL)
        self.log(f"elastic: engine-{i} still held requests after runtime.restart_timeout="
                 f"{self.source.restart_timeout:g}s; removed anyway (their episodes are retried)")

    def _remove(self, i: int) -> None:
        """Take replica i (the last) out again."""
        handle, group = self.source.engines[i], self.groups[i]
        self.source.engines, self.source.engine_names = self.source.engines[:i], self.source.engine_names[:i]
        self.groups = self.groups[:i]
        self._discard(handle, group)

    @staticmethod
    def _discard(handle: Any, group: Any) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
        if group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(group)

    # ------------------------------------------------------------------ env managers, weights
    def _rebind(self, managers: Any) -> None:
        """Bind env managers `managers` to their share of the current replicas."""
        import ray

        src = self.source
        refs = {}
        for m in managers:
            bound = bound_engines(m, len(src.managers), len(src.engines))
            refs[m] = src.managers[m].rebind.remote([src.engines[e] for e in bound],
                                                    [src.engine_names[e] for e in bound])
        for ref in refs.values():
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                pass  # dead: once Ray has restarted it, the source asks for it again (manager_back)

    def _check_transport(self) -> None:
        """Weights by the object store while the run's own transport cannot reach the replica list
        (a broadcast group never again; shm while a replica sits off rank 0's node)."""
        import ray

        src = self.source
        if self.home is None:
            self.home = src.transport
        if self.home.name == "broadcast":
            reason = "a broadcast group cannot grow or shrink"
        elif self.home.name == "shm":
            nodes = {info["node"] for info in ray.get([e.info.remote() for e in src.engines])}
            if nodes == {node_id()}:
                if src.transport is not self.home:
                    src.use_transport(self.home)
                    self.log("elastic: weights go by shm again (every replica on trainer rank 0's node)")
                return
            reason = "a replica sits off trainer rank 0's node"
        else:
            return
        if src.transport is not src.fallback:
            src.use_transport(src.fallback)
            self.log(f"elastic: weights go by the object store from now on ({reason})")

def release(prefix: str) -> None:
    """Remove every placement group trainer rank 0 made for the run `prefix` (its replicas die
    with rank 0, their owner; the groups would outlive it until the driver disconnects)."""
    import ray
    from ray.util.placement_group import get_placement_group, remove_placement_group

    for info in ray.util.placement_group_table().values():
        name = info.get("name") or ""
        if name.startswith(prefix) and info.get("state") != "REMOVED":
            with contextlib.suppress(Exception):
                remove_placement_group(get_placement_group(name))
