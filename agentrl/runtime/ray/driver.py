"""The Ray runtime (runtime.kind=ray): the same loop, its parts placed as Ray actors.

The driver (this process) checks the config, builds the policy (warm-starting the embedded
model if needed, as the local runtime does), starts or joins a cluster, checks the placement
against the cluster's resources before creating anything, reserves one placement group (with a
timeout), then launches the actors (runtime/ray/launch.py):

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
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.config import Config
from agentrl.errors import AgentRLError
from agentrl.metrics import write_summary
from agentrl.runtime.assembly.plan import RunPlan, plan
from agentrl.runtime.assembly.policy import build_policy
from agentrl.runtime.process import seed_everything
from agentrl.runtime.ray.cluster import init_cluster, require_ray
from agentrl.runtime.ray.engine_client import first_line
from agentrl.runtime.ray.launch import Actors, launch
from agentrl.runtime.ray.placement import HEAD, check_resources, reserve
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
            launched = launch(cfg, run_plan, pg, model, tokenizer, run_dir, actors)
            del model  # the actors hold their own copies
            run = RayRun(launched.rank0, launched.workers, run_dir, cfg, launched.transport)
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

