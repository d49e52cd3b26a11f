"""The Ray runtime (runtime.kind=ray): the same loop, its parts placed as Ray actors.

The driver (this process) checks the config, builds the policy (warm-starting the embedded
model if needed, as the local runtime does), starts or joins a cluster, checks the placement
against the cluster's resources before creating anything, reserves one placement group (with a
timeout), then creates the actors:

    actor_infer   EngineActor x world_size       (runtime/ray/engine_actor.py)
    env_managers  EnvManagerActor x n            (runtime/ray/env_manager.py)
    actor_train   TrainerActor (rank 0) + TrainWorkerActor x (world_size - 1)   (runtime/ray/train_actors.py)
    reference, critic   ModelRoleActor, when the algorithm uses them

Rank 0 runs the unchanged `Trainer` with a `RaySource` (runtime/ray/source.py) and writes the run
folder, which the driver keeps locked. The driver waits on it, watching the other trainer ranks:
a rank that dies stops the run with a message naming it and how to resume. Engines and env
managers are restarted by Ray (runtime.max_restarts) and their lost episodes are retried.
Rank 0 also adds and removes engine replicas as the run folder's scale request asks
(`RayRun.scale`, `agentrl scale`: runtime/ray/elastic.py); the driver gives back their placement
groups at the end.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentrl.agents.openai import portable_entry
from agentrl.config import Config
from agentrl.errors import AgentRLError
from agentrl.metrics import write_summary
from agentrl.runtime.assembly.plan import RunPlan, plan
from agentrl.runtime.assembly.plan_types import TagPlan
from agentrl.runtime.assembly.policy import build_policy, model_context, model_vocab
from agentrl.runtime.process import seed_everything
from agentrl.runtime.ray.cluster import init_cluster, require_ray
from agentrl.runtime.ray.engine_client import first_line
from agentrl.runtime.ray.placement import (
    HEAD,
    Plan,
    Worker,
    bound_engines,
    check_resources,
    choose_transport,
    options,
    replica_seed,
    reserve,
)
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
from agentrl.train.checkpoint import latest_checkpoint, step_of

WATCH_SECONDS = 1.0  # how often the driver checks on the trainer ranks


class TrainerRankDied(AgentRLError):
    """A trainer rank died: data-parallel training cannot go on without it."""


@contextlib.contextmanager
def cluster(cfg: Config, log: Callable[[str], None]) -> Iterator[None]:
    """A cluster for the run: the caller's when Ray is already initialised (left running), else a
    local one started here or the one at runtime.address (disconnected at the end)."""
    ray = require_ray()
    if ray.is_initialized():
        yield
        return
    rt = cfg.runtime
    temp = rt.temp_dir or tempfile.mkdtemp(prefix="agentrl-ray-")
    t0 = time.perf_counter()
    init_cluster(rt.num_cpus, rt.num_gpus, temp, rt.address)
    where = f"joined {rt.address}" if rt.address else f"started a local cluster ({rt.num_cpus or os.cpu_count()} CPUs)"
    ok = False
    try:
        log(f"ray: {where} in {time.perf_counter() - t0:.1f} s")
        yield
        ok = True
    except AgentRLError:  # the user's to fix, in the message: the session logs would not help
        ok = True
        raise
    finally:
        ray.shutdown()
        if not rt.temp_dir and not rt.address:
            if ok:
                shutil.rmtree(temp, ignore_errors=True)
            else:
                log(f"ray: session logs kept in {temp}")


def local_cluster_resources(cfg: Config) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(total, nodes) of the local cluster runtime.kind=ray would start here: known before
    starting it, so an impossible placement fails without waiting for Ray."""
    import torch

    rt = cfg.runtime
    node = {"CPU": float(rt.num_cpus or os.cpu_count() or 1),
            "GPU": float(rt.num_gpus if rt.num_gpus is not None else torch.cuda.device_count()), HEAD: 1.0}
    return node, [node]


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


@contextlib.contextmanager
def ray_trainer(cfg: Config, run_dir: Path, log: Callable[[str], None] = print,
                tokenizer: Tokenizer | None = None, run_plan: RunPlan | None = None) -> Iterator[RayRun]:
    """The run's parts placed on Ray; yields its run handle (runtime/handle.py), and stops every
    actor at the end (`run_plan`: the plan of `cfg` the caller already made)."""
    ray = require_ray()
    if run_plan is None:
        run_plan = plan(cfg, tokenizer)  # every model-free check before the cluster starts
    t_start = time.perf_counter()
    placement = run_plan.placement
    assert placement is not None, "the plan of a runtime.kind=ray config has a placement"
    rt = run_plan.runtime
    if not ray.is_initialized() and not rt.address:
        check_resources(placement, rt, *local_cluster_resources(cfg))  # before starting Ray: in a second
    with cluster(cfg, log):
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        check_resources(placement, rt, ray.cluster_resources(), nodes)
        # Before the model: a placement that cannot be had fails in seconds.
        pg = reserve(placement, rt.placement_timeout)
        t_placed = time.perf_counter()
        actors = Actors()
        try:
            seed_everything(run_plan.seed)
            model, tokenizer = build_policy(run_plan, log, tokenizer)  # as the local runtime: same draws
            t_policy = time.perf_counter()
            run = launch(cfg, run_plan, pg, model, tokenizer, run_dir, log, actors)
            del model  # the actors hold their own copies
            run.timings = {"ray_start_seconds": round(t_placed - t_start, 2),  # cluster, checks, placement group
                           "policy_seconds": round(t_policy - t_placed, 2),
                           "ray_actors_seconds": round(time.perf_counter() - t_policy, 2)}
            log(f"ray: placed {run_plan.placement_summary}; actors ready in {run.timings['ray_actors_seconds']:.1f}"
                f" s; weights by {run.transport}")
            yield run
        finally:
            actors.stop()
            from ray.util.placement_group import remove_placement_group

            from agentrl.runtime.ray.elastic import release

            release(actors.prefix)  # the placement groups of replicas rank 0 added

            with contextlib.suppress(Exception):
                remove_placement_group(pg)


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


def launch(cfg: Config, run_plan: RunPlan, pg: Any, model: Any, tokenizer: Tokenizer, run_dir: Path,
           log: Callable[[str], None], actors: Actors) -> RayRun:
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
    return RayRun(ranks.rank0, ranks.workers, run_dir, cfg, transport)


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


class RayRun:
    """The driver's handle on a placed run (runtime/handle.py): rank 0 runs the trainer."""

    def __init__(self, rank0: Any, workers: list[Any], run_dir: Path, cfg: Config, transport: str) -> None:
        self.rank0, self.workers, self.run_dir, self.cfg = rank0, workers, Path(run_dir), cfg
        self.transport = transport
        self.timings: dict[str, float] = {}

    @property
    def step_idx(self) -> int:
        """The last step trained."""
        return self._get(self.rank0.step.remote())

    def resume(self) -> None:
        """Rank 0 continues from the newest readable checkpoint."""
        self._get(self.rank0.restore.remote())

    def evaluate(self) -> dict[str, float]:
        """Rank 0's evaluation: the eval/ metrics."""
        return self._get(self.rank0.evaluate.remote())

    def scale(self, engines: int) -> None:
        """Ask for `engines` engine replicas: trainer rank 0 adds or removes replicas at the start of
        its next step (runtime/ray/elastic.py); callable while `fit` runs, from another thread."""
        from agentrl.runtime.ray.scale_file import check_ray_run, request_scale

        check_ray_run(self.run_dir, engines)
        request_scale(self.run_dir, engines)

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train (rank 0 runs the loop); the run's summary, with the Ray start-up times added."""
        summary = self._get(self.rank0.fit.remote(resume), watch=True)
        summary = {**summary, **self.timings}
        write_summary(self.run_dir, summary)
        return summary

    def _get(self, ref: Any, watch: bool = False) -> Any:
        """The result of a call on rank 0; watching the other ranks meanwhile."""
        import ray

        bar = _Progress(self.cfg, self.run_dir) if watch else None
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=WATCH_SECONDS)
                if ready:
                    return self._result(ref)
                if bar is not None:
                    bar.update()
                self._check_ranks()
        finally:
            if bar is not None:
                bar.close()

    def _result(self, ref: Any) -> Any:
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            self._check_ranks()  # a rank that died makes rank 0 fail too (its all-reduce broke): say so
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, BaseException) else e) from None
        except ray.exceptions.RayActorError as e:
            self._died(0, e)

    def _check_ranks(self) -> None:
        import ray

        for k, worker in enumerate(self.workers, start=1):
            try:
                ray.get(worker.ping.remote(), timeout=30)
            except ray.exceptions.RayActorError as e:
                self._died(k, e)
            except ray.exceptions.GetTimeoutError:
                pass  # busy beyond its second thread: not known dead

    def _died(self, rank: int, error: Exception) -> None:
        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        at = f"the newest checkpoint is step {step_of(ckpt)}" if ckpt else "no checkpoint was written yet"
        raise TrainerRankDied(f"trainer rank {rank} died ({first_line(error)}); the run stopped after step "
                              f"{last_step(self.run_dir)} and {at}: continue it with `agentrl resume {self.run_dir}`")


def last_step(run_dir: Path) -> int:
    """The last step metrics.jsonl holds (0 when none)."""
    from agentrl.metrics import read_jsonl

    path = run_dir / "metrics.jsonl"
    rows = read_jsonl(path) if path.is_file() else []
    return max((int(r.get("step", 0)) for r in rows), default=0)


class _Progress:
    """The driver's progress bar: steps as rank 0 logs them to metrics.jsonl."""

    def __init__(self, cfg: Config, run_dir: Path) -> None:
        t = cfg.trainer
        self.path, self.bar, self.offset = run_dir / "metrics.jsonl", None, 0
        if t.progress and "console" in t.logger and "jsonl" in t.logger:
            from tqdm import tqdm

            self.bar = tqdm(total=t.total_steps, unit="step", dynamic_ncols=True)

    def update(self) -> None:
        """Advance to the newest step logged."""
        if self.bar is None or not self.path.is_file():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        lines = chunk.split("\n")
        self.offset += len(chunk) - len(lines[-1])  # a torn last line is read again next time
        for line in lines[:-1]:
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if "reward/mean" in row:
                    self.bar.set_postfix({"reward": f"{row['reward/mean']:.2f}"}, refresh=False)
                self.bar.update(max(0, int(row.get("step", 0)) - self.bar.n))

    def close(self) -> None:
        """Finish the bar."""
        if self.bar is not None:
            self.update()
            self.bar.close()

