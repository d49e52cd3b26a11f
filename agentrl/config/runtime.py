"""The `runtime:` section: where a run's parts run (this process, or Ray actors placed ROLL-style).
Its checks that need no cluster are in checks.py (`check_runtime`), run when the config loads.

Roles take ROLL's names: `actor_train` (trainer ranks), `actor_infer` (engine replicas),
`reference`, `critic`, and `env_managers` (CPU actors that each play many episodes). A role on
GPUs lists global GPU indices in `device_mapping` (GPU k is the k-th GPU of the cluster, node by
node); two roles whose lists overlap share those GPUs (colocated); an empty list runs the role on
CPU, where `num_cpus` is what each worker reserves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

WEIGHT_SYNC = ("auto", "object_store", "shm", "nccl", "file")


@dataclass
class RoleConfig:
    """The workers of one role and where they run."""

    world_size: int = 1
    """Workers of this role (trainer ranks for actor_train, engine replicas for actor_infer)."""
    device_mapping: list[int] = field(default_factory=list)
    """Global GPU indices, one per worker; lists that overlap between roles colocate them on those
    GPUs. Empty: the role runs on CPU."""
    num_cpus: float = 1.0
    """Logical CPUs each worker reserves from Ray's scheduler (its torch threads are
    runtime.num_threads, the same in every process of a run)."""


@dataclass
class RuntimeConfig:
    """Where the parts of a run run: `local` (this process) or `ray` (Ray actors)."""

    kind: Literal["local", "ray"] = "local"
    """local: every part in this process. ray: trainer ranks, engines, env managers (and the critic
    and reference when used) as Ray actors; needs the `ray` extra."""
    num_threads: int = 1
    """torch's intra-op CPU threads in every process of the run (this one, and each Ray actor): CPU
    kernels split their sums by thread count, so a fixed count gives the same metrics in both
    runtimes and on any machine, whatever its cores or OMP_NUM_THREADS. 1 by default: what a Ray
    actor of 1 CPU runs, and faster than 2 on a busy 2-core machine; raise it for large models on
    CPU (a Ray actor then runs more threads than the CPUs it reserves)."""
    address: str | None = None
    """Ray cluster to join (ray.init(address=...), e.g. auto or ray://head:10001); null starts a
    local cluster for the run and stops it at the end."""
    num_cpus: int | None = None
    """Logical CPUs of the local cluster a run starts (null: this machine's count). More than the
    machine has oversubscribes its cores on purpose."""
    num_gpus: int | None = None
    """GPUs of the local cluster a run starts (null: the ones Ray detects)."""
    actor_train: RoleConfig = field(default_factory=RoleConfig)
    """Trainer ranks: world_size > 1 trains data-parallel (torch DDP; gloo on CPU, NCCL on GPU)."""
    actor_infer: RoleConfig = field(default_factory=RoleConfig)
    """Engine replicas: each a Ray actor holding an inference engine."""
    reference: RoleConfig = field(default_factory=lambda: RoleConfig(num_cpus=0.0))
    """The frozen reference model's actor (when a KL term uses it); world_size 1."""
    critic: RoleConfig = field(default_factory=lambda: RoleConfig(num_cpus=0.0))
    """The critic's actor (critic.enable); world_size 1."""
    env_managers: int = 1
    """Env-manager actors; a step's groups are split between them in contiguous blocks, and each
    plays its groups' episodes concurrently against the engine replicas bound to it."""
    env_manager_num_cpus: float = 0.0
    """Logical CPUs each env manager reserves (0: they mostly wait on engines)."""
    weight_sync: Literal["auto", "object_store", "shm", "nccl", "file"] = "auto"
    """How trainer rank 0 sends new weights to the engines: auto picks nccl when both sit on
    distinct GPUs, shm when every engine shares rank 0's node, object_store otherwise; file (a
    safetensors file in the run folder) works anywhere the run folder is shared."""
    engine_transport: Literal["ray", "http"] = "ray"
    """How env managers reach the engine replicas: ray (actor calls that step each replica in lock
    step with its clients, so a run's batches, and metrics, equal the local runtime's) or http
    (each replica serves the agentrl HTTP API on its node's IP, port 0, a random key per run; env
    managers hold a RemoteEngine on those URLs, the contract of engine.kind=remote). Weights reach
    the replicas by runtime.weight_sync either way. Served engines (engine.kind=remote / vllm) are
    always reached over HTTP."""
    placement_timeout: float = 60.0
    """Seconds to wait for the cluster to place every actor before failing with what is missing."""
    max_restarts: int = 3
    """Times Ray restarts a dead engine or env-manager actor (their in-flight episodes fail and are
    retried under rollout.max_retries); trainer ranks are never restarted: the run stops."""
    restart_timeout: float = 120.0
    """Seconds callers wait for a restarting actor before counting its work as failed."""
    collective_timeout: float = 600.0
    """Seconds a torch.distributed operation (gradient all-reduce, NCCL weight broadcast) may wait
    for a peer before failing."""
    temp_dir: str | None = None
    """Ray's session folder for a cluster the run starts (null: a fresh temporary folder, removed
    after a run that succeeds)."""


# auto, HOST:PORT (a cluster's GCS) or ray://HOST[:PORT] (Ray client); HOST a name, IPv4 or [IPv6].
ADDRESS_FORM = re.compile(r"(?P<client>ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>[0-9]{1,5}))?")


def placement_summary(rt: RuntimeConfig, served: bool = False, attached: bool = False, starts: str = "") -> str:
    """One line naming every role's workers, where they run and how requests reach the engines
    (`served`: the engine kind generates on inference servers; `attached`: the engines are the
    servers of engine.urls; `starts`: what each engine replica starts, e.g. vLLM servers)."""
    def where(role: RoleConfig) -> str:
        return f"GPUs {role.device_mapping}" if role.device_mapping else f"{role.num_cpus:g} CPU each"
    infer = (f"actor_infer {rt.actor_infer.world_size} ({where(rt.actor_infer)})"
             + (f" starting {starts}" if starts else ""))
    if attached:
        infer = "actor_infer none (the servers of engine.urls)"
    transport = "http" if served else rt.engine_transport  # served engines answer HTTP only
    return (f"actor_train {rt.actor_train.world_size} ({where(rt.actor_train)}), {infer}, env_managers "
            f"{rt.env_managers} ({rt.env_manager_num_cpus:g} CPU each) reaching the engines by {transport}")
