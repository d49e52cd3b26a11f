"""The `runtime:` section: where a run's parts run (this process, or Ray actors placed ROLL-style),
and the checks of it that need no cluster (run when the config loads, before any model exists).

Roles take ROLL's names: `actor_train` (trainer ranks), `actor_infer` (engine replicas),
`reference`, `critic`, and `env_managers` (CPU actors that each play many episodes). A role on
GPUs lists global GPU indices in `device_mapping` (GPU k is the k-th GPU of the cluster, node by
node); two roles whose lists overlap share those GPUs (colocated); an empty list runs the role on
CPU, where `num_cpus` is what each worker reserves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Optional

from agentrl.errors import ConfigError, shown

if TYPE_CHECKING:
    from agentrl.config.schema import Config

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
    address: Optional[str] = None
    """Ray cluster to join (ray.init(address=...), e.g. auto or ray://head:10001); null starts a
    local cluster for the run and stops it at the end."""
    num_cpus: Optional[int] = None
    """Logical CPUs of the local cluster a run starts (null: this machine's count). More than the
    machine has oversubscribes its cores on purpose."""
    num_gpus: Optional[int] = None
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
    the replicas by runtime.weight_sync either way."""
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
    temp_dir: Optional[str] = None
    """Ray's session folder for a cluster the run starts (null: a fresh temporary folder, removed
    after a run that succeeds)."""


def check_runtime(cfg: Config) -> None:
    """Every runtime check that needs no cluster, one line each; a role whose world_size is left
    at 1 takes one worker per GPU of its device_mapping (ROLL's reading)."""
    rt = cfg.runtime
    roles = {"actor_train": rt.actor_train, "actor_infer": rt.actor_infer, "reference": rt.reference,
             "critic": rt.critic}
    for name, role in roles.items():
        if role.world_size == 1 and len(role.device_mapping) > 1:
            role.world_size = len(role.device_mapping)
        _check_role(f"runtime.{name}", role)
    if rt.kind == "local":
        _check_local(cfg)
        return
    if rt.address is not None:
        check_address(rt.address)
    for name in ("reference", "critic"):
        if roles[name].world_size != 1:
            raise ConfigError(f"runtime.{name}.world_size={roles[name].world_size}: the {name} runs as one "
                              "actor; set it to 1")
    groups = cfg.rollout.batch_size // cfg.rollout.group_size
    if rt.env_managers > groups:
        raise ConfigError(f"runtime.env_managers={rt.env_managers} but a step has {groups} groups "
                          f"(rollout.batch_size / rollout.group_size): at most {groups} env managers get work")
    n = rt.actor_train.world_size
    if cfg.actor.ppo_mini_batch_size < n:
        raise ConfigError(f"runtime.actor_train.world_size={n} splits each mini-batch between {n} ranks, but "
                          f"actor.ppo_mini_batch_size={cfg.actor.ppo_mini_batch_size} has fewer rows; raise it "
                          f"to at least {n}")
    if cfg.rollout.max_staleness:
        raise ConfigError(f"rollout.max_staleness={cfg.rollout.max_staleness}: runtime.kind=ray plays on-policy "
                          "only (asynchronous rollout on Ray is not built yet); use rollout.max_staleness=0 or "
                          "runtime.kind=local")
    # Combinations the Ray runtime does not place yet: refused by name rather than run differently.
    if cfg.model.lora.enabled:
        raise ConfigError(f"model.lora.rank={cfg.model.lora.rank} with runtime.kind=ray: LoRA trains in the local "
                          "runtime only for now; use runtime.kind=local or model.lora.rank=0")
    if cfg.engine.kind != "local":
        raise ConfigError(f"engine.kind={cfg.engine.kind} with runtime.kind=ray: Ray places its own engine replicas "
                          "(runtime.actor_infer); use engine.kind=local, or runtime.kind=local to generate on engine.urls")
    openai_tags = [tag for tag in cfg.env_definitions() if cfg.agent_for(tag).type == "openai"]
    if openai_tags:
        raise ConfigError(f"agent.type=openai (env group {openai_tags[0]!r}) with runtime.kind=ray: OpenAI-client "
                          "agents run in the local runtime only for now; use runtime.kind=local")
    on_gpu = [name for name, role in roles.items() if role.device_mapping]
    if cfg.device == "cuda" and "actor_train" not in on_gpu:
        raise ConfigError("device=cuda with runtime.kind=ray: Ray places models on GPUs by device_mapping; set "
                          "runtime.actor_train.device_mapping (and actor_infer's), e.g. [0]")
    if cfg.device == "cpu" and on_gpu:
        raise ConfigError(f"device=cpu but runtime.{on_gpu[0]}.device_mapping places it on GPUs; use device=auto")
    if rt.weight_sync == "nccl":
        train, infer = set(rt.actor_train.device_mapping[:1]), set(rt.actor_infer.device_mapping)
        if not train or not infer:
            raise ConfigError("runtime.weight_sync=nccl broadcasts between GPUs: set runtime.actor_train.device_mapping "
                              "and runtime.actor_infer.device_mapping (or weight_sync=auto)")
        if train & infer:
            raise ConfigError(f"runtime.weight_sync=nccl needs the engines on other GPUs than trainer rank 0 "
                              f"(GPU {sorted(train)[0]} is in runtime.actor_infer.device_mapping); NCCL cannot "
                              "broadcast between processes on one GPU: use weight_sync=auto")


# auto, HOST:PORT (a cluster's GCS) or ray://HOST[:PORT] (Ray client); HOST a name, IPv4 or [IPv6].
ADDRESS_FORM = re.compile(r"(?P<client>ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>[0-9]{1,5}))?")


def check_address(address: str) -> None:
    """runtime.address has a form Ray joins: auto, HOST:PORT or ray://HOST[:PORT] (one line otherwise)."""
    if address == "auto":
        return
    m = ADDRESS_FORM.fullmatch(address)
    port = m and m["port"]
    if not m or not (port or m["client"]) or port and not 1 <= int(port) <= 65535:
        raise ConfigError(f"runtime.address={shown(address)} is not a Ray cluster address; give auto, HOST:PORT (the "
                          "head's GCS, e.g. 10.0.0.1:6379) or ray://HOST:PORT (Ray client, e.g. ray://head:10001), or "
                          "null to start a local cluster")


def _check_role(key: str, role: RoleConfig) -> None:
    # world_size and the GPU indices were bounded by check_limits; a world_size derived from
    # device_mapping stays within it since indices are bounded and distinct.
    mapping = role.device_mapping
    if len(set(mapping)) != len(mapping):
        raise ConfigError(f"{key}.device_mapping={mapping} names a GPU twice; each worker takes one GPU")
    if mapping and len(mapping) != role.world_size:
        raise ConfigError(f"{key}.device_mapping={mapping} has {len(mapping)} GPUs for world_size="
                          f"{role.world_size}; give one GPU per worker")


def _check_local(cfg: Config) -> None:
    """runtime.kind=local ignores nothing silently: placement fields need kind=ray."""
    rt, default = cfg.runtime, RuntimeConfig()
    for key in ("address", "num_cpus", "num_gpus", "actor_train", "actor_infer", "reference", "critic",
                "env_managers", "env_manager_num_cpus", "weight_sync", "engine_transport", "temp_dir"):
        if getattr(rt, key) != getattr(default, key):
            raise ConfigError(f"runtime.{key} is set but runtime.kind=local runs every part in this process; "
                              "add runtime.kind=ray to place the run on Ray")


def placement_summary(rt: RuntimeConfig) -> str:
    """One line naming every role's workers, where they run and how requests reach the engines."""
    def where(role: RoleConfig) -> str:
        return f"GPUs {role.device_mapping}" if role.device_mapping else f"{role.num_cpus:g} CPU each"
    return (f"actor_train {rt.actor_train.world_size} ({where(rt.actor_train)}), actor_infer "
            f"{rt.actor_infer.world_size} ({where(rt.actor_infer)}), env_managers {rt.env_managers} "
            f"({rt.env_manager_num_cpus:g} CPU each) reaching the engines by {rt.engine_transport}")
