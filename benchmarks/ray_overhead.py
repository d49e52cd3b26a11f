"""What the Ray runtime costs over the local one, on the same work, and what each weight transport
costs per MB.

(1) Per-step overhead: `configs/frozen_lake.yaml` for `--steps` steps, the same seed and the same
    warm-started model (model.path), every process on `--threads` torch threads
    (runtime.num_threads), run by the local runtime and by runtime.kind=ray with
    `--replicas` engines and `--managers` env managers; mean perf/step_seconds over the steps
    after the first, the stages it splits into (collect, update, sync), eval success after, and
    Ray's start-up (cluster, placement group, actors); the Ray run twice, its env managers
    reaching the engines by Ray actor calls and over HTTP (runtime.engine_transport=ray|http),
    `http_over_ray_step` the ratio of their step times. On a machine with fewer cores than actors
    the Ray run time-shares them: read the ratio, not the seconds.
(2) Weight sync: synthetic float32 weights of `--mb` MB sent from this process to `--receivers`
    actors that copy them into a model-sized buffer (what an engine's load_state_dict does),
    through each transport that runs here (object_store, shm, file; the broadcast over gloo,
    the code path NCCL runs on GPUs); best of `--repeats`, in ms per MB.
(3) With a CUDA device, the 1-GPU colocated case too: trainer and engine on GPU 0
    (runtime.actor_train.device_mapping=[0], actor_infer=[0]).

The last line is a JSON summary.

    python benchmarks/ray_overhead.py                               # 1 engine, 1 env manager, 6 steps
    python benchmarks/ray_overhead.py --replicas 2 --managers 2 --steps 60 --learn   # the full run
    python benchmarks/ray_overhead.py --quick      # a tiny model, 2 steps, 1 MB synced once: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.models.embedded import cache_root, tiny_cache_key
from agentrl.registry import load_builtins
from agentrl.runtime.assembly.policy import load_policy
from agentrl.runtime.local import train
from agentrl.runtime.assembly.plan import plan
from agentrl.runtime.ray.weight_sync import make_transport

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "frozen_lake.yaml"
# --quick: a tiny model warm-started for a few steps, small batches (tests/e2e/test_train.py's TINY)
QUICK = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
         "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
         "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
         "env.max_turns=3", "env.args.max_steps=3"]


def run_one(name: str, args: argparse.Namespace, model: Path, folder: Path, extra: list[str],
            base: list[str]) -> dict:
    """One training run (local, ray or ray_http); its wall time, step times and summary."""
    kind = "local" if name == "local" else "ray"
    if name == "ray_http":
        extra = [*extra, "runtime.engine_transport=http"]
    over = [*base, f"model.path={model}", f"run_dir={folder / name}", f"trainer.total_steps={args.steps}",
            "trainer.progress=false", "trainer.logger=[jsonl]", f"runtime.kind={kind}",
            f"runtime.num_threads={args.threads}", *extra]
    if not args.learn:
        over += ["trainer.test_freq=0", f"trainer.eval_episodes={2 if args.quick else 8}"]
    if kind == "ray":
        over += [f"runtime.actor_infer.world_size={args.replicas}", f"runtime.env_managers={args.managers}",
                 f"runtime.actor_infer.num_cpus={args.engine_cpus}"]
    cfg = load_config(CONFIG, over)
    t0 = time.perf_counter()
    summary = train(cfg, overwrite=True, log=lambda m: print(f"  {m}", file=sys.stderr))
    wall = time.perf_counter() - t0
    rows = [r for r in read_jsonl(folder / name / "metrics.jsonl") if "perf/step_seconds" in r][1:]
    mean = lambda key: statistics.mean(r.get(key, 0.0) for r in rows)  # noqa: E731
    out = {"wall_s": round(wall, 2), "step_s": round(mean("perf/step_seconds"), 4),
           "collect_s": round(mean("perf/time_collect"), 4), "update_s": round(mean("perf/time_update"), 4),
           "sync_s": round(mean("perf/time_sync"), 4), "eval_success_after": summary["eval_success_after"]}
    for key in ("ray_start_seconds", "policy_seconds", "ray_actors_seconds"):
        if key in summary:
            out[key] = summary[key]
    return out


class Receiver:
    """Stands for an engine: copies what a transport carries into model-sized buffers."""

    def __init__(self, layout: list) -> None:
        torch.set_num_threads(1)
        self.buffers = {name: torch.empty(shape, dtype=getattr(torch, dtype)) for name, dtype, shape in layout}
        self.group = None

    def join(self, host: str, port: int, rank: int, size: int) -> bool:
        self.group = make_transport("gloo")
        self.group.join(host, port, rank, size, timeout=120)
        return True

    def load(self, payload) -> int:
        transport = self.group if payload.transport == "broadcast" else make_transport(payload.transport)
        with transport.receive(payload) as weights:
            for name, t in weights.items():
                self.buffers[name].copy_(t)
        return payload.version


def sync_times(mb: int, receivers: int, repeats: int, folder: Path) -> dict[str, float]:
    """Best ms per MB of each transport: send + every receiver's copy + release."""
    import ray

    from agentrl.runtime.ray.workers import free_address

    n = mb * 2**20 // 4 // 16
    weights = {f"layer{i}.weight": torch.randn(n) for i in range(16)}
    layout = [(k, "float32", tuple(v.shape)) for k, v in sorted(weights.items())]
    actors = [ray.remote(Receiver).options(num_cpus=0).remote(layout) for _ in range(receivers)]
    host, port = free_address()
    group = make_transport("gloo")
    joins = [a.join.remote(host, port, i + 1, receivers + 1) for i, a in enumerate(actors)]
    group.join(host, port, 0, receivers + 1, timeout=120)
    ray.get(joins)
    out = {}
    for name in ("object_store", "shm", "file", "broadcast"):
        transport = group if name == "broadcast" else make_transport(name, folder / "weights")
        best = float("inf")
        for version in range(1, repeats + 1):
            t0 = time.perf_counter()
            payload = transport.send(weights, version)
            refs = [a.load.remote(payload) for a in actors]
            if name == "broadcast":
                transport.broadcast(weights)
            assert ray.get(refs) == [version] * receivers
            transport.release(payload)
            best = min(best, time.perf_counter() - t0)
        out[f"{name}_ms_per_mb"] = round(1000 * best / mb, 3)
    for a in actors:
        ray.kill(a)
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run both measurements; print and return the summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6, help="training steps per run")
    p.add_argument("--replicas", type=int, default=1, help="engine replicas of the Ray run")
    p.add_argument("--managers", type=int, default=1, help="env managers of the Ray run")
    p.add_argument("--engine-cpus", type=float, default=1.0, help="runtime.actor_infer.num_cpus")
    p.add_argument("--learn", action="store_true", help="keep the config's evaluations (the full run)")
    p.add_argument("--mb", type=int, default=64, help="weight-sync size")
    p.add_argument("--receivers", type=int, default=2, help="engines receiving the weights")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-runs", action="store_true", help="only the weight-sync measurement")
    p.add_argument("--threads", type=int, default=1,
                   help="runtime.num_threads: torch threads of every process, local and each Ray actor")
    p.add_argument("--quick", action="store_true",
                   help="a tiny model, 2 steps, small batches, 1 MB synced once to 1 receiver (smoke run)")
    args = p.parse_args(argv)
    base = QUICK if args.quick else []
    if args.quick:
        args.steps, args.mb, args.receivers, args.repeats = 2, 1, 1, 1
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    folder = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    ray_temp = tempfile.mkdtemp(prefix="agentrl-ray-")
    try:
        summary = measure(args, base, folder, ray_temp)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(ray_temp, ignore_errors=True)
    print(json.dumps(summary))
    return summary


def measure(args: argparse.Namespace, base: list[str], folder: Path, ray_temp: str) -> dict:
    """The runs (unless --skip-runs) and the weight-sync times; the summary."""
    cfg = load_config(CONFIG, base)
    load_builtins()
    load_policy(plan(cfg), log=lambda m: print(f"  {m}", file=sys.stderr))
    model = cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"
    summary: dict = {"cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1), "steps": args.steps,
                     "replicas": args.replicas, "managers": args.managers, "threads": args.threads,
                     "quick": args.quick}
    if not args.skip_runs:
        runs = {name: run_one(name, args, model, folder, [], base) for name in ("local", "ray", "ray_http")}
        for name, r in runs.items():
            print(f"{name:8s} {json.dumps(r)}", flush=True)
        summary.update({f"{k}_{key}": v for k, r in runs.items() for key, v in r.items()})
        summary["ray_step_overhead_s"] = round(runs["ray"]["step_s"] - runs["local"]["step_s"], 4)
        summary["ray_over_local_step"] = round(runs["ray"]["step_s"] / runs["local"]["step_s"], 3)
        summary["ray_over_local_wall"] = round(runs["ray"]["wall_s"] / runs["local"]["wall_s"], 3)
        summary["http_over_ray_step"] = round(runs["ray_http"]["step_s"] / runs["ray"]["step_s"], 3)
        summary["http_over_local_step"] = round(runs["ray_http"]["step_s"] / runs["local"]["step_s"], 3)
        if torch.cuda.is_available():  # written for a GPU machine; the trainer and engine share GPU 0
            gpu = run_one("ray", args, model, folder / "gpu", ["runtime.actor_train.device_mapping=[0]",
                                                                "runtime.actor_infer.device_mapping=[0]"], base)
            summary.update({f"gpu_colocated_{k}": v for k, v in gpu.items()})
    from agentrl.runtime.ray.driver import init_cluster

    import ray

    init_cluster(temp_dir=ray_temp)
    try:
        summary.update(sync_times(args.mb, args.receivers, args.repeats, folder))
    finally:
        ray.shutdown()
    summary["sync_mb"] = args.mb
    return summary


if __name__ == "__main__":
    main()
