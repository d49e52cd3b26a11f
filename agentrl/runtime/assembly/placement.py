"""Where each worker of a Ray run goes (ROLL's device mapping), computed from the runtime section
alone (no cluster): part of the run plan. runtime/ray/placement.py checks it against the
cluster and reserves it.

Bundles: one per GPU named in any role's device_mapping ({GPU: 1, CPU: what its workers
reserve}; the workers of every role mapped to that GPU share it, each with an equal fraction,
which is how overlapping lists colocate), and one per CPU worker that reserves CPUs. Trainer
rank 0, which writes the run folder, is pinned to the head node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.config.runtime import RuntimeConfig

HEAD = "node:__internal_head__"  # a resource only the head node has


@dataclass
class Worker:
    """One actor of the run and what it reserves."""

    role: str  # actor_train, actor_infer, reference, critic, env_manager
    index: int
    num_cpus: float
    gpu: int | None = None  # global GPU index from device_mapping
    gpu_share: float = 0.0  # fraction of that GPU (1 / workers colocated on it)
    bundle: int | None = None  # placement-group bundle; None: reserves nothing, placed anywhere


@dataclass
class Plan:
    """Every worker and the bundles they sit in."""

    workers: list[Worker]
    bundles: list[dict[str, float]] = field(default_factory=list)

    def of(self, role: str) -> list[Worker]:
        """The workers of `role`, by index."""
        return [w for w in self.workers if w.role == role]


def plan_placement(rt: RuntimeConfig, reference: bool, critic: bool, engines: bool = True) -> Plan:
    """Workers and bundles of the runtime section `rt` (reference / critic when the run uses them;
    no engine replica when `engines` is false: the run generates on the servers of engine.urls)."""
    roles = [("actor_train", rt.actor_train)] + [("actor_infer", rt.actor_infer)] * engines
    roles += [("reference", rt.reference)] * reference + [("critic", rt.critic)] * critic
    workers = [Worker(name, i, role.num_cpus, role.device_mapping[i] if role.device_mapping else None)
               for name, role in roles for i in range(role.world_size)]
    workers += [Worker("env_manager", i, rt.env_manager_num_cpus) for i in range(rt.env_managers)]
    plan = Plan(workers)
    for gpu in sorted({w.gpu for w in workers if w.gpu is not None}):
        on_it = [w for w in workers if w.gpu == gpu]
        bundle = {"GPU": 1.0, "CPU": sum(w.num_cpus for w in on_it)}
        for w in on_it:
            w.bundle, w.gpu_share = len(plan.bundles), 1.0 / len(on_it)
        plan.bundles.append({k: v for k, v in bundle.items() if v > 0})
    for w in workers:
        if w.gpu is None and w.num_cpus > 0:
            w.bundle = len(plan.bundles)
            plan.bundles.append({"CPU": w.num_cpus})
    rank0 = plan.of("actor_train")[0]
    if rank0.bundle is None:
        rank0.bundle = len(plan.bundles)
        plan.bundles.append({})
    plan.bundles[rank0.bundle][HEAD] = 0.001
    return plan
