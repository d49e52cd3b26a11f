"""A training step with each rollout engine: ours (engine.kind=local) and a vLLM server
(engine.kind=vllm, started by the run), on the default FrozenLake config.

Each run is `agentrl train configs/frozen_lake.yaml` as a user starts it (a process of its own),
on the embedded tiny model and on the 24M shape (hidden 512 x 8 layers, the `large` shape of
benchmarks/rollout_throughput.py); both engines of a shape share one warm start (the model cache).
Reported per engine, medians over the steps after the first (the first pays for warm-up: vLLM's
first requests, our engine's first compiled shapes): the whole step, its rollout, its update, and
the weight sync (pause, transfer, probe check, resume for vLLM; a state-dict copy for ours), with
vllm/local ratios, and the run's wall time (vLLM's includes its server start, reported apart).
The last line is a JSON summary.

    python benchmarks/engine_step.py                     # tiny and 24M, both engines, 6 steps
    python benchmarks/engine_step.py --quick             # tiny, our engine, 2 short steps (smoke)
    python benchmarks/engine_step.py --engines local,vllm --shapes tiny --steps 4

vLLM runs with the interpreter of `--vllm-python` (default: this checkout's .venv-vllm, which
`make vllm` builds; AGENTRL_VLLM_PYTHON overrides it), --enforce-eager on a CPU. Where it has no
vLLM the summary says so and only our engine is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.llm.vllm.launch import missing_vllm  # noqa: E402
from agentrl.metrics import read_jsonl  # noqa: E402

SHAPES = {
    "tiny": [],  # the embedded default: warm-started as `agentrl train` does it
    # The 24M shape, warm-started briefly: a timing run, not a learning one.
    "24m": ["model.tiny.hidden_size=512", "model.tiny.num_hidden_layers=8", "model.tiny.num_attention_heads=8",
            "model.tiny.num_key_value_heads=4", "model.tiny.intermediate_size=1408", "model.warm_start.max_steps=20"],
}
ENGINES = {
    "local": ["engine.kind=local"],
    "vllm": ["engine.kind=vllm", "engine.vllm.args=[--enforce-eager]"],
}
PARTS = {"step": "perf/step_seconds", "rollout": "perf/time_collect", "update": "perf/time_update",
         "weight_sync": "perf/time_sync"}


def run(engine: str, shape: str, steps: int, work: Path, vllm_python: str, extra: list[str]) -> dict:
    """One `agentrl train` run; its per-step parts (medians after step 1) and wall time."""
    run_dir = work / f"{shape}-{engine}"
    args = ["configs/frozen_lake.yaml", *SHAPES[shape], *ENGINES[engine], f"trainer.total_steps={steps}",
            "trainer.test_freq=0", "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]",
            f"run_dir={run_dir}", f"model.cache_dir={work / 'cache'}", *extra]
    if engine == "vllm":
        args.append(f"engine.vllm.python={vllm_python}")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", *args], cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{shape}/{engine}: agentrl train exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "perf/step_seconds" in r]
    timed = rows[1:] or rows  # the first step pays for warm-up
    out = {part: statistics.median(r.get(key, 0.0) for r in timed) for part, key in PARTS.items()}
    out["steps_timed"] = len(timed)
    out["run_seconds"] = wall
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engines", default=None, help="comma-separated, of: " + ", ".join(ENGINES))
    p.add_argument("--shapes", default=None, help="comma-separated, of: " + ", ".join(SHAPES))
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 6; --quick 2)")
    p.add_argument("--vllm-python", default=os.environ.get("AGENTRL_VLLM_PYTHON",
                                                            str(ROOT / ".venv-vllm" / "bin" / "python")))
    p.add_argument("--quick", action="store_true",
                   help="tiny (narrower), our engine only, 2 steps of 8 episodes, a 1-step warm start")
    p.add_argument("overrides", nargs="*", help="config overrides for every run, e.g. rollout.batch_size=16")
    args = p.parse_args()
    engines = (args.engines or ("local" if args.quick else "local,vllm")).split(",")
    shapes = (args.shapes or ("tiny" if args.quick else "tiny,24m")).split(",")
    steps = args.steps or (2 if args.quick else 6)
    extra = list(args.overrides)
    if args.quick:  # a smoke run: a narrower tiny model, a one-step warm start, 8 episodes a step, 2 evaluated
        extra = ["model.warm_start.max_steps=1", "rollout.batch_size=8", "actor.ppo_mini_batch_size=8",
                 "actor.micro_batch_size=8", "trainer.eval_episodes=2", "model.tiny.hidden_size=32",
                 "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64", *extra]
    for name, known in (("--engines", ENGINES), ("--shapes", SHAPES)):
        bad = [x for x in (engines if name == "--engines" else shapes) if x not in known]
        if bad:
            p.error(f"{name}: unknown {', '.join(bad)}; known: {', '.join(known)}")
    skipped = {}
    if "vllm" in engines:
        why = missing_vllm(args.vllm_python)
        if why:
            skipped["vllm"] = f"{args.vllm_python} {why} (run `make vllm`, or give --vllm-python)"
            engines.remove("vllm")
            print(f"vllm skipped: {skipped['vllm']}", file=sys.stderr)

    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-engine-step-") as tmp:
        for shape in shapes:
            for engine in engines:
                print(f"{shape}/{engine}: {steps} steps ...", file=sys.stderr, flush=True)
                results.setdefault(shape, {})[engine] = run(engine, shape, steps, Path(tmp), args.vllm_python, extra)

    print(f"\n{'shape':6} {'engine':6} " + " ".join(f"{k + ' s':>14}" for k in PARTS) + f" {'run s':>8}")
    for shape, by_engine in results.items():
        for engine, r in by_engine.items():
            print(f"{shape:6} {engine:6} " + " ".join(f"{r[k]:14.3f}" for k in PARTS) + f" {r['run_seconds']:8.0f}")
        if {"local", "vllm"} <= by_engine.keys():
            ratio = {k: by_engine["vllm"][k] / by_engine["local"][k] for k in PARTS if by_engine["local"][k] > 0}
            by_engine["vllm_over_local"] = ratio
            print(f"{shape:6} {'ratio':6} " + " ".join(f"{ratio.get(k, float('nan')):13.2f}x" for k in PARTS)
                  + "   (vllm / local time: below 1 is vLLM faster)")
    print(json.dumps({"quick": args.quick, "steps": steps, "shapes": results, "skipped": skipped}))


if __name__ == "__main__":
    main()
