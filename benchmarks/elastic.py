"""Elastic rollout on Ray: a run going 1 -> 3 -> 1 engine replicas while it trains, its step times
and metrics step by step.

`configs/frozen_lake.yaml` on runtime.kind=ray from a warm-started model (model.path), one env
manager, engines of `--engine-cpus` CPUs each, a local cluster of `--cluster-cpus` logical CPUs.
The run starts with one replica; its env asks for 3 (`request_scale`, what `agentrl scale RUN_DIR
engines=3` writes) during the first training episode of the last step of the first third, and for
1 again in the last step of the second third, so each request lands at the next step boundary
whatever the machine's load. Printed per step: replicas (ray/engine_replicas), perf/step_seconds,
the collect stage, reward/mean, failed episodes; then the mean step time per replica count, the
step times at the two changes (they include starting a replica or draining one), the largest
step-to-step change of reward/mean inside and across the changes. The last line is a JSON summary.

    python benchmarks/elastic.py                  # 12 steps: 4 on 1 replica, 4 on 3, 4 on 1
    python benchmarks/elastic.py --steps 24       # 8 + 8 + 8
    python benchmarks/elastic.py --quick          # a tiny model, 3 steps: 1, 3, 1 (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from agentrl.config import load_config
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.metrics import read_jsonl
from agentrl.models.embedded import cache_root, tiny_cache_key
from agentrl.registry import load_builtins, register_env
from agentrl.rollout.tasks import EVAL_SEED_BASE
from agentrl.runtime.assembly.policy import load_policy
from agentrl.runtime.local import train
from agentrl.runtime.assembly.plan import plan
from agentrl.runtime.ray.scale_file import request_scale

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "frozen_lake.yaml"
QUICK = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
         "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
         "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
         "env.max_turns=3", "env.args.max_steps=3"]


class ScaledLake(FrozenLakeEnv):
    """FrozenLake whose training episodes ask the run for other replica counts: `plan` is
    [[episode, engines], ...]; the reset of training episode number `episode` (counted by files
    in `marker`, so every process counts) writes the request, once."""

    def __init__(self, marker: str = "", run_dir: str = "", plan: list | None = None, **lake) -> None:
        super().__init__(**lake)
        self.marker, self.run_dir, self.plan = Path(marker), run_dir, [tuple(p) for p in plan or []]

    async def reset(self, seed=None, options=None):
        if self.plan and seed is not None and seed < EVAL_SEED_BASE:
            (self.marker / f"episode-{uuid.uuid4().hex}").touch()
            n = sum(1 for p in self.marker.iterdir() if p.name.startswith("episode-"))
            for at, engines in self.plan:
                if n >= at and _first(self.marker / f"asked-{at}"):
                    request_scale(self.run_dir, engines)
        return await super().reset(seed=seed, options=options)


def _first(path: Path) -> bool:
    try:  # O_EXCL: one process, once
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def run(args: argparse.Namespace, base: list[str], folder: Path, ray_temp: str) -> dict:
    """The scaled run; its per-step rows and summary."""
    cfg = load_config(CONFIG, base)
    load_policy(plan(cfg), log=lambda m: print(f"  {m}", file=sys.stderr))
    model = cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"
    marker, run_dir = folder / "marker", folder / "run"
    marker.mkdir()
    third = args.steps // 3
    batch = cfg.rollout.batch_size
    # The first episode of the last step on 1 replica, then of the last step on 3.
    schedule = [[(third - 1) * batch + 1, 3], [(2 * third - 1) * batch + 1, 1]]
    over = [*base, f"model.path={model}", f"run_dir={run_dir}", f"trainer.total_steps={args.steps}",
            "trainer.progress=false", "trainer.logger=[jsonl]", "trainer.test_freq=0",
            f"trainer.eval_episodes={2 if args.quick else 8}", "runtime.kind=ray", f"runtime.num_threads={args.threads}",
            f"runtime.num_cpus={args.cluster_cpus}", f"runtime.actor_infer.num_cpus={args.engine_cpus}",
            f"runtime.temp_dir={ray_temp}", "env.type=scaled_lake", f"env.args.marker={marker}",
            f"env.args.run_dir={run_dir}", f"env.args.plan={json.dumps(schedule)}"]
    summary = train(load_config(CONFIG, over), log=lambda m: print(f"  {m}", file=sys.stderr))
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "perf/step_seconds" in r]
    return {"rows": rows, "summary": summary, "third": third}


def report(result: dict, args: argparse.Namespace) -> dict:
    """Print the steps; the JSON summary."""
    rows, third = result["rows"], result["third"]
    print(f"{'step':>4} {'replicas':>8} {'step_s':>7} {'collect_s':>9} {'reward':>7} {'failed':>6}")
    for r in rows:
        print(f"{r['step']:>4} {r['ray/engine_replicas']:>8g} {r['perf/step_seconds']:>7.2f} "
              f"{r.get('perf/time_collect', 0.0):>9.2f} {r.get('reward/mean', float('nan')):>7.3f} "
              f"{r.get('rollout/failed_episodes', 0.0):>6g}")
    replicas = [int(r["ray/engine_replicas"]) for r in rows]
    steps = [round(r["perf/step_seconds"], 3) for r in rows]
    rewards = [round(r.get("reward/mean", float("nan")), 4) for r in rows]
    changes = [i for i in range(1, len(rows)) if replicas[i] != replicas[i - 1]]
    jumps = [abs(rewards[i] - rewards[i - 1]) for i in range(1, len(rows))]
    at_change = [jumps[i - 1] for i in changes]
    by_count = {}
    for n in sorted(set(replicas)):  # the steps of a count, less the one that started or drained replicas
        times = [s for i, (s, k) in enumerate(zip(steps, replicas)) if k == n and i not in changes and i > 0]
        by_count[str(n)] = round(statistics.mean(times), 3) if times else None
    return {"cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1), "quick": args.quick,
            "steps": len(rows), "replicas": replicas, "step_s": steps, "reward": rewards,
            "failed_episodes": sum(r.get("rollout/failed_episodes", 0.0) for r in rows),
            "mean_step_s_by_replicas": by_count, "change_step_s": [steps[i] for i in changes],
            "reward_jump_max_within": round(max((j for i, j in enumerate(jumps, 1) if i not in changes), default=0), 4),
            "reward_jump_at_changes": [round(j, 4) for j in at_change],
            "eval_success_before": result["summary"].get("eval_success_before"),
            "eval_success_after": result["summary"].get("eval_success_after"), "third": third}


def main(argv: list[str] | None = None) -> dict:
    """Run the scaled run; print and return the summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="training steps (a third on each count)")
    p.add_argument("--engine-cpus", type=float, default=0.5, help="runtime.actor_infer.num_cpus")
    p.add_argument("--cluster-cpus", type=int, default=4, help="logical CPUs of the local cluster (runtime.num_cpus)")
    p.add_argument("--threads", type=int, default=1, help="runtime.num_threads")
    p.add_argument("--quick", action="store_true", help="a tiny model, 3 steps: 1, 3, 1 replicas (smoke run)")
    args = p.parse_args(argv)
    base = QUICK if args.quick else []
    if args.quick:
        args.steps = 3
    if args.steps < 3:
        p.error(f"--steps={args.steps}: at least 3 (a third on each replica count)")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    load_builtins()
    register_env("scaled_lake", ScaledLake, overwrite=True)
    folder = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    ray_temp = tempfile.mkdtemp(prefix="agentrl-ray-")
    try:
        summary = report(run(args, base, folder, ray_temp), args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(ray_temp, ignore_errors=True)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
