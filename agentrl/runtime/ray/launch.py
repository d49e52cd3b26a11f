"""Launching a placed Ray run: every actor created in its bundle of the placement group, job by
job (`start_engines`, `start_env_managers`, `start_trainer_ranks`), the collective groups joined
(the trainer ranks'; for `nccl`, the weights'), and trainer rank 0 handed what was placed as one
typed record (`SourceParts`, runtime/ray/workers.py). The driver (runtime/ray/driver.py) starts
the cluster, reserves the placement and builds the policy before; it watches the run after."""

from __future__ import annotations

import contextlib
import copy
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentrl.agents.openai import portable_entry
from agentrl.config import Config
from agentrl.errors import AgentRLError
from agentrl.runtime.assembly.plan import RunPlan
from agentrl.runtime.assembly.plan_types import TagPlan
from agentrl.runtime.assembly.policy import model_context, model_vocab
from agentrl.runtime.ray.engine_client import first_line
from agentrl.runtime.ray.placement import Plan, Worker, bound_engines, choose_transport, options, replica_seed
from agentrl.runtime.ray.workers import (
    RunSpec,
    ServedReplicas,
    SharedSpec,
    SourceParts,
    model_source,
    share,
    user_registrations,
)
from agentrl.tokenizer import Tokenizer


def actor_config(cfg: Config, run_dir: Path) -> Config:
    """The config trainer rank 0's `Trainer` gets: absolute paths (an actor's working folder may
    differ), no progress bar in actors (the driver shows one)."""
    out = copy.deepcopy(cfg)
    out.run_dir = str(run_dir.resolve())
    out.imports = [_absolute(p) for p in cfg.imports]
    if out.model.path:
        out.model.path = str(Path(out.model.path).expanduser().resolve())
    out.trainer.progress = False
    return out


def actor_plan(run_plan: RunPlan, run_dir: Path) -> RunPlan:
    """The plan actors build their parts from: as `actor_config`, and without env factories (an
    actor binds its own after importing the user's modules)."""
    model = run_plan.model
    if model.path:
        model = replace(model, path=str(Path(model.path).expanduser().resolve()))
    return replace(run_plan.portable(), run_dir=str(run_dir.resolve()), model=model,
                   imports=tuple(_absolute(p) for p in run_plan.imports),
                   trainer=replace(run_plan.trainer, progress=False),
                   tags=tuple(_portable_tag(t) for t in run_plan.tags))


def _portable_tag(tag: TagPlan) -> TagPlan:
    """An OpenAI-client agent's entry, its .py path made absolute (as `imports`)."""
    if tag.agent_type != "openai" or "entry" not in tag.agent_args:
        return tag
    return replace(tag, agent_args={**tag.agent_args, "entry": portable_entry(tag.agent_args["entry"])})


def _absolute(module: str) -> str:
    """A .py path of `imports`, made absolute; a module name as it is."""
    return str(Path(module).expanduser().resolve()) if module.endswith(".py") else module


class Actors:
    """Every actor of the run, to stop them all at the end."""

    def __init__(self) -> None:
        self.prefix = f"agentrl-{uuid.uuid4().hex[:8]}-"
        self.handles: list[Any] = []
        self.keep: list[Any] = []  # object refs the actors read (on restarts too)
        self.servers: list[Any] = []  # vLLM replica actors: their servers are stopped before they are killed

    def create(self, cls: type, name: str, worker: Any, pg: Any, args: tuple, **kw: Any) -> Any:
        """`cls(*args)` as a named actor in `worker`'s bundle."""
        import ray

        handle: Any = ray.remote(cls).options(name=self.prefix + name, **options(worker, pg), **kw).remote(*args)
        self.handles.append(handle)
        return handle

    def stop(self) -> None:
        """Kill every actor (no restart)."""
        import ray

        with contextlib.suppress(Exception):
            ray.get([h.stop.remote() for h in self.servers], timeout=60)
        self.servers.clear()
        for handle in self.handles:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        self.handles.clear()
        self.keep.clear()


def wait_all(refs: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """{name: result} of actor calls; an actor that failed to start is one line naming it."""
    import ray

    out: dict[str, Any] = {}
    for name, ref in refs.items():
        try:
            out[name] = ray.get(ref, timeout=timeout)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, AgentRLError):
                raise cause from None
            raise AgentRLError(f"{name} failed to start: {first_line(cause or e)}") from None
        except ray.exceptions.RayActorError as e:
            raise AgentRLError(f"{name} failed to start: {first_line(e)}") from None
        except ray.exceptions.GetTimeoutError:
            raise AgentRLError(f"{name} did not answer within {timeout:g} s") from None
    return out


@dataclass(frozen=True)
class Launched:
    """What the driver holds of a launched run: trainer rank 0 (which runs the loop), the other
    ranks (watched for deaths), and how weights travel (for the start-up line)."""

    rank0: Any
    workers: list[Any]
    transport: str


def launch(cfg: Config, run_plan: RunPlan, pg: Any, model: Any, tokenizer: Tokenizer, run_dir: Path,
           actors: Actors) -> Launched:
    """Create every actor of `run_plan`'s placement in its bundle (engines, env managers, trainer
    ranks), join the collective groups, and build the trainer (whose loop reads `cfg`)."""
    from agentrl.runtime.ray.engine_actor import EngineActor

    rt, aplan, placement = run_plan.runtime, actor_plan(run_plan, run_dir), run_plan.placement
    assert placement is not None, "the plan of a runtime.kind=ray config has a placement"
    key = uuid.uuid4().hex if rt.engine_transport == "http" else None  # os.urandom
    shared = share(RunSpec(aplan, actor_config(cfg, run_dir), tokenizer,
                           model_source(aplan.model.path, aplan.model.dtype, model), model_context(model),
                           user_registrations(), model_vocab(model)))
    infer = placement.of("actor_infer")
    kind = run_plan.engine_kind
    served = kind.served  # inference servers (runtime/ray/served.py)
    replica_cls: type = EngineActor
    if served:
        key = uuid.uuid4().hex  # the key of the vLLM servers the replicas start (os.urandom)
    if infer and kind.ray_replica == "vllm":  # each replica starts a vLLM server (runtime/ray/vllm_replica.py)
        replica_cls = vllm_replicas(aplan, model, tokenizer)
    engines, names = start_engines(run_plan, infer, pg, actors, shared, replica_cls, key)
    if served:
        actors.servers = list(engines)
    managers = start_env_managers(run_plan, placement.of("env_manager"), pg, actors, shared, engines, names, key)
    ranks = start_trainer_ranks(placement, pg, actors, shared)
    actors.keep.append(shared)  # the spec (and the model in it) lives as long as the run: restarts read it
    started = wait_all({name: h.info.remote() for name, h in
                        [*zip(names, engines), *[(f"env manager {i}", m) for i, m in enumerate(managers)],
                         *ranks.named()]})
    join_trainer_group(ranks, rt.collective_timeout)
    elastic = None  # replicas of served engines are not scaled (the servers are the user's or vLLM's)
    if served:  # rank 0 pushes through the engine the local runtime would build on these servers
        transport = served_transport(run_plan)
        parts = SourceParts([], [], managers, "object_store", "", served=ServedReplicas(engines, key))
    else:
        from agentrl.runtime.ray.elastic import ElasticSpec

        engine_infos = [{**started[n], "gpu": w.gpu} for n, w in zip(names, infer)]
        rank0_info = {**started["trainer rank 0"], "gpu": placement.of("actor_train")[0].gpu}
        transport = choose_transport(rt.weight_sync, rank0_info, engine_infos)
        parts = SourceParts(engines, names, managers, "object_store" if transport == "nccl" else transport,
                            str(Path(aplan.run_dir) / ".weight_sync"))
        elastic = ElasticSpec(shared, pg, infer, actors.prefix, run_plan.seed, key, rt.max_restarts, aplan.run_dir,
                              rt.placement_timeout, bool(rt.actor_infer.device_mapping))
    wait_all({"trainer rank 0": ranks.rank0.setup.remote(parts, ranks.workers, ranks.roles.get("reference"),
                                                         ranks.roles.get("critic"), elastic)})
    if transport == "nccl":
        join_weight_group(ranks.rank0, engines, names, rt.collective_timeout)
    return Launched(ranks.rank0, ranks.workers, transport)


def start_engines(run_plan: RunPlan, infer: list[Worker], pg: Any, actors: Actors, shared: SharedSpec,
                  replica_cls: type, key: str | None) -> tuple[list[Any], list[str]]:
    """(actors, names) of the engine replicas (`infer`: actor_infer's workers), each in its bundle,
    restarted by Ray."""
    names = [f"engine-{w.index}" for w in infer]
    seeds = [replica_seed(run_plan.seed, w.index) for w in infer]
    engines = [actors.create(replica_cls, names[i], w, pg, (shared, w.index, seeds[i], key),
                             max_restarts=run_plan.runtime.max_restarts, max_task_retries=0)
               for i, w in enumerate(infer)]
    return engines, names


def start_env_managers(run_plan: RunPlan, workers: list[Worker], pg: Any, actors: Actors, shared: SharedSpec,
                       engines: list[Any], names: list[str], key: str | None) -> list[Any]:
    """The env managers (`workers`: env_manager's), each in its bundle and bound to its share of the
    engine replicas."""
    from agentrl.runtime.ray.env_manager import EnvManagerActor

    rt = run_plan.runtime
    managers = []
    for w in workers:
        bound = bound_engines(w.index, rt.env_managers, len(engines)) if engines else []
        managers.append(actors.create(EnvManagerActor, f"env_manager-{w.index}", w, pg,
                                      (shared, [engines[e] for e in bound], [names[e] for e in bound], w.index, key),
                                      max_restarts=rt.max_restarts, max_task_retries=0))
    return managers


@dataclass(frozen=True)
class TrainerRanks:
    """The learning side's actors: trainer rank 0, the other ranks, and the reference and critic."""

    rank0: Any
    workers: list[Any]  # ranks 1 .. world_size - 1
    roles: dict[str, Any]  # "reference" / "critic": its actor, when the algorithm uses it

    def named(self) -> list[tuple[str, Any]]:
        """(name for messages, actor) of each."""
        return [("trainer rank 0", self.rank0), *[(f"trainer rank {i + 1}", h) for i, h in enumerate(self.workers)],
                *self.roles.items()]


def start_trainer_ranks(placement: Plan, pg: Any, actors: Actors, shared: SharedSpec) -> TrainerRanks:
    """Trainer rank 0, the other ranks, and the reference and critic actors, each in its bundle
    (none restarted: training cannot go on without one)."""
    from agentrl.runtime.ray.train_actors import ModelRoleActor, TrainerActor, TrainWorkerActor

    train = placement.of("actor_train")
    rank0 = actors.create(TrainerActor, "actor_train-0", train[0], pg, (shared,), max_restarts=0)
    workers = [actors.create(TrainWorkerActor, f"actor_train-{w.index}", w, pg, (shared, w.index),
                             max_restarts=0, max_concurrency=2) for w in train[1:]]
    roles = {w.role: actors.create(ModelRoleActor, w.role, w, pg, (shared, w.role), max_restarts=0)
             for w in placement.workers if w.role in ("reference", "critic")}
    return TrainerRanks(rank0, workers, roles)


def join_trainer_group(ranks: TrainerRanks, timeout: float) -> None:
    """The trainer ranks' collective group, when there are several: every rank joins at once."""
    if ranks.workers:
        host, port = wait_all({"trainer rank 0": ranks.rank0.dist_address.remote()})["trainer rank 0"]
        wait_all({f"trainer rank {i}": h.init_dist.remote(host, port)
                  for i, h in enumerate([ranks.rank0, *ranks.workers])}, timeout=timeout)


def join_weight_group(rank0: Any, engines: list[Any], names: list[str], timeout: float) -> None:
    """The NCCL group trainer rank 0 broadcasts weights in to the engine replicas (rank 0 first)."""
    host, port = wait_all({"trainer rank 0": rank0.weight_group_address.remote()})["trainer rank 0"]
    size = len(engines) + 1
    wait_all({"weight group": rank0.join_weight_group.remote(host, port, size, "nccl"),
              **{n: e.join_weight_group.remote(host, port, i + 1, size, "nccl")
                 for i, (n, e) in enumerate(zip(names, engines))}}, timeout=timeout)


def vllm_replicas(run_plan: RunPlan, model: Any, tokenizer: Tokenizer) -> type:
    """The actor class of engine.kind=vllm replicas, once the model folder their servers start from
    exists (the embedded policy is written to the run folder here)."""
    from agentrl.models.loading import save_pretrained
    from agentrl.runtime.ray.vllm_replica import VllmReplicaActor, model_folder

    folder = model_folder(run_plan)
    if not run_plan.model.path:
        save_pretrained(model, tokenizer, folder)
    return VllmReplicaActor


def served_transport(run_plan: RunPlan) -> str:
    """How weights reach served engines, for the start-up line."""
    return run_plan.engine_kind.weights_route(run_plan.engine)
