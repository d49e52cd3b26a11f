"""A Ray run's placement (runtime/assembly/placement.py: workers and bundles, from the plan) checked
against the cluster before any actor exists, and the one placement group that reserves it all,
with a timeout. The group uses Ray's PACK strategy: as few nodes as the bundles fit on. Also
which engine replicas each env manager uses, and each replica's seed (the driver's and, when
replicas are added mid-run, runtime/ray/elastic.py's).
"""

from __future__ import annotations

from typing import Any

from agentrl.config.runtime import RuntimeConfig
from agentrl.errors import ConfigError
from agentrl.rollout.tasks import mix
from agentrl.runtime.assembly.placement import HEAD, Plan, Worker, plan_placement

__all__ = ["HEAD", "Plan", "Worker", "bound_engines", "check_resources", "choose_transport", "options",
           "plan_placement", "replica_seed", "reserve"]

EPS = 1e-6


def _needs(plan: Plan) -> str:
    """What the plan reserves, role by role, for messages."""
    parts = []
    for role in ("actor_train", "actor_infer", "reference", "critic", "env_manager"):
        ws = plan.of(role)
        if ws:
            name = "env_managers" if role == "env_manager" else role
            cpus = f"{len(ws)} x {ws[0].num_cpus:g} CPU"
            gpus = [w.gpu for w in ws if w.gpu is not None]
            parts.append(f"{name} {cpus}" + (f" on GPUs {gpus}" if gpus else ""))
    return ", ".join(parts)


def check_resources(plan: Plan, rt: RuntimeConfig, total: dict[str, float], nodes: list[dict[str, float]]) -> None:
    """Refuse, in one line naming what is missing, a plan the cluster can never hold (`rt`: the
    runtime section; `total`: the cluster's resources; `nodes`: each alive node's)."""
    gpus = total.get("GPU", 0.0)
    for role in ("actor_train", "actor_infer", "reference", "critic"):
        mapping = getattr(rt, role).device_mapping
        if mapping and max(mapping) + 1 > gpus + EPS:
            have = f"{gpus:g} GPUs" if gpus else "no GPU"
            fix = (f"map it onto GPUs 0..{int(gpus) - 1}" if gpus >= 1 else
                   f"leave device_mapping empty to run {role} on CPU")
            raise ConfigError(f"runtime.{role}.device_mapping={mapping} needs GPU {max(mapping)}, but the cluster "
                              f"has {have}; {fix}")
    cpus = sum(b.get("CPU", 0.0) for b in plan.bundles)
    if cpus > total.get("CPU", 0.0) + EPS:
        raise ConfigError(f"the run needs {cpus:g} CPUs ({_needs(plan)}) but the cluster has "
                          f"{total.get('CPU', 0.0):g}: lower a role's world_size or num_cpus (e.g. "
                          f"runtime.actor_infer.num_cpus=0.5), or start a larger cluster (runtime.num_cpus)")
    for bundle in plan.bundles:
        if not any(all(node.get(k, 0.0) + EPS >= v for k, v in bundle.items()) for node in nodes):
            shown = {k: v for k, v in bundle.items() if k != HEAD}
            where = " on the head node (trainer rank 0 writes the run folder there)" if HEAD in bundle else ""
            raise ConfigError(f"no node of the cluster can hold {shown}{where}; nodes have "
                              f"{[{k: v for k, v in n.items() if k in ('CPU', 'GPU')} for n in nodes]}: "
                              "spread the role over more workers with fewer CPUs each")


def reserve(plan: Plan, placement_timeout: float) -> Any:
    """The placement group of `plan`, placed within runtime.placement_timeout, else a one-line error."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(plan.bundles, strategy="PACK")
    timeout = placement_timeout
    try:
        ray.get(pg.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        free = {k: round(v, 3) for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
        raise ConfigError(f"the cluster did not place the run ({_needs(plan)}) within "
                          f"runtime.placement_timeout={timeout:g}s; free now: {free}: other work holds the "
                          "rest, or a node is gone") from None
    return pg


def options(plan_worker: Worker, pg: Any) -> dict[str, Any]:
    """Ray actor options that put `plan_worker` in its bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    out: dict[str, Any] = {"num_cpus": plan_worker.num_cpus, "num_gpus": plan_worker.gpu_share}
    if plan_worker.bundle is not None:
        out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=plan_worker.bundle, placement_group_capture_child_tasks=False)
    return out


def choose_transport(weight_sync: str, rank0: dict[str, Any], engines: list[dict[str, Any]]) -> str:
    """runtime.weight_sync (`weight_sync`), with auto resolved by where rank 0 and the engines
    landed (their `info()`: node, and GPU index from the plan)."""
    wanted = weight_sync
    same_node = all(e["node"] == rank0["node"] for e in engines)
    if wanted == "shm" and not same_node:
        raise ConfigError("runtime.weight_sync=shm needs every engine on trainer rank 0's node, but the cluster "
                          "placed some elsewhere; use weight_sync=auto (object_store across nodes) or file")
    if wanted != "auto":
        return wanted
    gpu0, engine_gpus = rank0.get("gpu"), [e.get("gpu") for e in engines]
    if gpu0 is not None and all(g is not None and g != gpu0 for g in engine_gpus):
        return "nccl"
    return "shm" if same_node else "object_store"


def replica_seed(seed: int, index: int) -> int:
    """The engine seed of replica `index` (replica 0 has the run's: one replica samples as the local run)."""
    return seed if index == 0 else mix(seed, index)


def bound_engines(manager: int, managers: int, engines: int) -> list[int]:
    """The engine replicas env manager `manager` sends its episodes to: its own share when there
    are at least as many replicas as managers, else one replica shared with other managers."""
    if engines >= managers:
        return [e for e in range(engines) if e % managers == manager]
    return [manager % engines]
