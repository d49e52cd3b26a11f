"""What every Ray actor of a run shares: process set-up (torch threads, registrations), the policy
model as it travels to actors, and where a role's models live."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, cast

import torch

from agentrl.config import Config
from agentrl.config.runtime import RoleConfig
from agentrl.models.loading import DTYPES
from agentrl.registry import AGENTS, ENVS, ESTIMATORS, FILE_MODULES, POLICY_LOSSES, load_builtins
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.process import pin_threads
from agentrl.tokenizer import Tokenizer

REGISTRIES = {"env": ENVS, "agent": AGENTS, "estimator": ESTIMATORS, "policy_loss": POLICY_LOSSES}


@dataclass
class ModelSource:
    """The policy's starting weights as an actor gets them: loaded from model.path on its own
    node (no copy through the driver), or, for a model built in the driver (the embedded
    default), from the object store."""

    path: str | None = None
    dtype: str = "float32"
    refs: list[Any] | None = None  # [ObjectRef of the model]: nested, so the actor fetches it itself

    def load(self) -> torch.nn.Module:
        """A fresh copy of the starting model, on CPU."""
        if self.path is not None:
            from agentrl.models.loading import load_pretrained

            model, _ = load_pretrained(self.path, self.dtype)
            return model
        import ray

        assert self.refs is not None  # a spec without a path carries the model's ref
        return cast(torch.nn.Module, ray.get(self.refs[0]))


@dataclass
class RunSpec:
    """What every actor of a run is built from."""

    plan: RunPlan  # the driver's plan (without env factories: an actor binds its own, runtime/assembly/envs.py)
    cfg: Config  # read by trainer rank 0's `Trainer` only; every part is built from the plan
    tokenizer: Tokenizer
    model: ModelSource
    context: int  # the model's longest sequence (episode budgets)
    registrations: dict[str, dict[str, Any]]  # user_registrations() of the driver
    vocab_size: int | None = None  # the model's vocabulary: ids an agent returns must lie below it


@dataclass
class SharedSpec:
    """A RunSpec in the object store, handed to actors by reference: their constructor arguments
    stay small and inline, so Ray can always rerun a constructor when it restarts an actor."""

    refs: list[Any]  # [ObjectRef of the RunSpec]

    def get(self) -> RunSpec:
        """The spec (fetched from the object store)."""
        import ray

        return ray.get(self.refs[0])


@dataclass(frozen=True)
class ServedReplicas:
    """Engine replicas that run inference servers (engine.kind=remote / vllm): trainer rank 0
    drives their servers (runtime/ray/served.py)."""

    replicas: list[Any]  # the replica actors, by index
    api_key: str | None  # the key of their servers (the driver makes one whenever they are served)


@dataclass(frozen=True)
class SourceParts:
    """What the driver placed for trainer rank 0's rollout source (runtime/ray/source.py)."""

    engines: list[Any]  # engine replica actors rank 0 feeds weights (none when `served`)
    engine_names: list[str]  # their names, for messages
    managers: list[Any]  # the env manager actors
    transport: str  # how weights reach the engines first (object_store until an NCCL group is joined)
    weights_dir: str  # the folder of transport=file
    served: ServedReplicas | None = None  # engine.kind=remote / vllm: the servers rank 0 drives instead


def share(spec: RunSpec) -> SharedSpec:
    """Put `spec` in the object store (the caller keeps the result alive for the run)."""
    import ray

    return SharedSpec([ray.put(spec)])


def model_source(cfg_model_path: str | None, dtype: str, model: torch.nn.Module) -> ModelSource:
    """How actors get the policy: its folder when it has one, else the object store."""
    if cfg_model_path:
        return ModelSource(path=cfg_model_path, dtype=dtype)
    import ray

    return ModelSource(dtype=dtype, refs=[ray.put(model)])


def user_registrations() -> dict[str, dict[str, Any]]:
    """Registry entries made in the driver by user code (classes passed to fit / AgentTrainer,
    register_env calls in a script): actors register them too. Entries of agentrl's own modules
    and of `imports` (which each actor imports itself) are left out."""
    load_builtins()
    out: dict[str, dict[str, Any]] = {}
    for kind, registry in REGISTRIES.items():
        for name in registry.names():
            obj = registry.get(name)
            module = getattr(obj, "__module__", "") or ""
            if not (module == "agentrl" or module.startswith("agentrl.") or module in FILE_MODULES):
                out.setdefault(kind, {})[name] = obj
    return out


def setup_worker(num_threads: int, registrations: dict[str, dict[str, Any]] | None = None) -> None:
    """An actor's process: the run's torch threads (runtime.num_threads, as the driver and a local
    run use, whatever OMP_NUM_THREADS Ray gave the actor for its CPUs), the built-ins and the
    driver's registrations."""
    pin_threads(num_threads)
    load_builtins()
    for kind, entries in (registrations or {}).items():
        for name, obj in entries.items():
            REGISTRIES[kind].register(name, obj, overwrite=True)


def role_device(role: RoleConfig) -> torch.device:
    """cuda for a role placed on GPUs (Ray shows each worker its own), else cpu."""
    return torch.device("cuda") if role.device_mapping else torch.device("cpu")


def load_model(source: ModelSource, role: RoleConfig, dtype: str = "float32") -> torch.nn.Module:
    """The starting model on the role's device, in `dtype`."""
    return source.load().to(device=role_device(role), dtype=DTYPES[dtype])


def node_id() -> str:
    """The Ray node this process runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()


def free_address() -> tuple[str, int]:
    """This node's IP and a free TCP port (for a torch.distributed store hosted here)."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port
