"""Steps to the same eval success with and without a curriculum (rollout.curriculum).

For each config (random-map FrozenLake, Sokoban) and seed it trains twice from the same warm
start: the config as shipped (every group plays a fresh env seed) and with
`rollout.curriculum.enable=true` (groups drawn from a pool by each task's estimated success).
Both arms evaluate every `--eval-every` steps on the same held-out tasks. The target of a
(config, seed) is the lower of the two arms' best eval success (a success both reached); each
arm's "steps to target" is the first evaluated step at or above it (0: before training). The
table also gives eval success before, best and last, and the curriculum's share of draws from
its pool. The last line is a JSON summary.

    python benchmarks/curriculum.py                 # both configs, seeds 0-2, their 200 steps: 12 runs
    python benchmarks/curriculum.py --configs frozen_lake_random --seeds 0 --steps 60
    python benchmarks/curriculum.py --curriculum rollout.curriculum.pool_size=128   # other curriculum settings
    python benchmarks/curriculum.py --quick         # a tiny model, 2 steps, seed 0: a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.assembly.trainer import build_trainer

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("frozen_lake_random", "sokoban")
# --quick: a tiny model warm-started for a few steps, small batches (tests/e2e/test_train.py's TINY)
QUICK = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
         "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
         "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
         "env.max_turns=3", "env.args.max_steps=3", "trainer.eval_episodes=2"]


def train(config: str, seed: int, extra: list[str], run_dir: Path, cache: Path | None) -> list[dict]:
    """Train one arm; its metrics rows."""
    over = [f"seed={seed}", f"run_dir={run_dir}", "trainer.progress=false", "trainer.logger=[jsonl]",
            "trainer.save_freq=0", *extra]
    if cache is not None:
        over.append(f"model.cache_dir={cache}")
    cfg = load_config(ROOT / "configs" / f"{config}.yaml", over)
    build_trainer(cfg, run_dir, log=lambda m: None).fit()
    return read_jsonl(run_dir / "metrics.jsonl")


def evals(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, eval success) of every evaluation, in order."""
    return [(r["step"], r["eval/success"]) for r in rows if "eval/success" in r]


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated step whose success is at least `target` (None: never)."""
    return next((step for step, success in curve if success >= target - 1e-9), None)


def compare(config: str, seed: int, base: list[str], curriculum: list[str], work: Path, cache: Path | None) -> dict:
    """Both arms of one (config, seed): their curves and steps to the shared target."""
    arms = {"off": base, "on": [*base, "rollout.curriculum.enable=true", *curriculum]}
    rows = {arm: train(config, seed, extra, work / f"{config}-{seed}-{arm}", cache) for arm, extra in arms.items()}
    curves = {arm: evals(r) for arm, r in rows.items()}
    target = min(max(s for _, s in curve) for curve in curves.values())
    out = {"config": config, "seed": seed, "target": target}
    for arm, curve in curves.items():
        draws = [r["curriculum/pool_draws"] for r in rows[arm] if "curriculum/pool_draws" in r]
        out[arm] = {"before": curve[0][1], "best": max(s for _, s in curve), "last": curve[-1][1],
                    "steps_to_target": steps_to(curve, target), "curve": curve,
                    **({"pool_draws": statistics.mean(draws)} if draws else {})}
    return out


def table(results: list[dict]) -> str:
    """The results as a markdown table."""
    lines = ["| config | seed | target | steps to target off / on | eval before | best off / on | last off / on "
             "| pool draws |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        off, on = r["off"], r["on"]
        lines.append(f"| {r['config']} | {r['seed']} | {r['target']:.2f} | {off['steps_to_target']} / "
                     f"{on['steps_to_target']} | {off['before']:.2f} | {off['best']:.2f} / {on['best']:.2f} | "
                     f"{off['last']:.2f} / {on['last']:.2f} | {on.get('pool_draws', 0.0):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """Run every (config, seed), print the table and the JSON summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help="configs/ names, comma-separated")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=0, help="training steps (0: the config's own)")
    p.add_argument("--eval-every", type=int, default=20, help="trainer.test_freq of both arms")
    p.add_argument("--curriculum", nargs="*", default=[], help="more key=value settings of the curriculum arm")
    p.add_argument("--quick", action="store_true", help="a tiny model, 2 steps, seed 0, for a smoke run")
    args = p.parse_args(argv)
    base = [f"trainer.test_freq={1 if args.quick else args.eval_every}"]
    if args.steps or args.quick:
        base.append(f"trainer.total_steps={2 if args.quick else args.steps}")
    if args.quick:
        args.seeds = "0"
        base += QUICK
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cache = work / "cache" if args.quick else None  # full runs share the user's warm-start cache
        for config in args.configs.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                results.append(compare(config, seed, base, args.curriculum, work, cache))
                r = results[-1]
                print(f"{config} seed {seed}: target {r['target']:.2f}, steps to it off {r['off']['steps_to_target']}"
                      f" / on {r['on']['steps_to_target']}", flush=True)
    print(table(results))
    summary = {"quick": args.quick, "results": [{k: v for k, v in r.items()} for r in results]}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
