"""Every script in benchmarks/ runs in its quickest mode (`--quick`) as a user of a fresh clone
runs it: a process of its own, started outside the checkout with an empty model cache (its own:
every warm start it needs is computed anew), ending with its JSON summary line. Nothing is
copied: the script and the package are this checkout's (PYTHONPATH). A smoke run: no timing is
asserted (a reduced budget on a shared CPU says nothing about speed). A new script is covered by
being in the folder."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
NEEDS = {"ray_overhead": "ray", "elastic": "ray"}  # optional backends some scripts measure (the dev extra installs them)


def _gpu_suite(summary: dict) -> None:
    """The reduced shape runs every section."""
    (shape,) = summary["shapes"].values()
    assert summary["quick"]
    assert shape["rollout"]["generated_tokens"] > 0 and shape["rollout"]["speedup_vs_lockstep"] > 0
    gap = shape["precision"]["gap"]
    assert gap["fp32"]["max"] >= 0 and gap["bf16_weights"]["mean"] >= 0
    update = shape["update"]
    assert update["full"]["tokens_per_s"] > 0 and update["lora"]["tokens_per_s"] > 0
    assert update["sync"]["lora"]["tensor_elements"] < update["sync"]["full"]["tensor_elements"]
    assert shape["staleness"]["k0_step_seconds"] > 0 and shape["staleness"]["k1_step_seconds"] > 0


def _prefix_sharing(summary: dict) -> None:
    """Every workload's groups share prefixes: fewer ids computed, the same logprobs and loss."""
    assert set(summary["workloads"]) == {"frozen_lake", "math_retry", "window"}
    for r in summary["workloads"].values():
        assert r["ids_ratio"] < 1 and r["activation_ratio"] < 1
        assert r["max_logprob_diff"] < 1e-4 and r["loss_diff"] < 1e-5


def _elastic(summary: dict) -> None:
    """The run went 1 -> 3 -> 1 replicas, one step each, and lost no episode to it."""
    assert summary["replicas"] == [1, 3, 1] and summary["failed_episodes"] == 0


def _update_memory(summary: dict) -> None:
    """Chunked logits: lower peaks where the vocabulary is wide, the same loss and gradient norm everywhere."""
    big = summary["shapes"]["qwen0.5b"]  # 151,936-id vocabulary
    assert big["old_logprobs_ratio"] < 0.5 and big["passes_ratio"] < 1
    for r in summary["shapes"].values():
        assert r["loss_diff"] < 1e-5 and r["grad_norm_rel_diff"] < 1e-4


def _turn_credit(summary: dict) -> None:
    """Every estimator trained its steps and was evaluated after them."""
    assert set(summary["runs"]) == {"turn", "outcome", "token", "gigpo", "gae"} and summary["steps"] == 2
    for run in summary["runs"].values():
        (r,) = run.values()
        assert 0 <= r["wait_share_last"] <= 1 and 0 <= r["eval_success_after"] <= 1


def _rollout_overlap(summary: dict) -> None:
    """Serial, thread and process ran, each on torch's threads and on the split ones (1,1): best
    wall seconds per MODE_GENxUPD threads."""
    threads = summary["cores"]
    for mode in ("serial", "thread", "process"):
        assert summary[f"{mode}_1x1"] > 0 and summary[f"{mode}_{threads}x{threads}"] > 0
    assert summary["thread_over_best_serial"] > 0 and summary["process_over_best_serial"] > 0


def _async_rollout(summary: dict) -> None:
    """Lockstep and the collector at k = 0, 1, 2 each timed their steps."""
    assert all(summary[f"step_seconds_{m}"] > 0 for m in ("lockstep", "k=0", "k=1", "k=2"))
    assert summary["speedup_vs_lockstep"] > 0


CHECKS = {"gpu_suite": _gpu_suite, "prefix_sharing": _prefix_sharing, "elastic": _elastic,
          "update_memory": _update_memory, "turn_credit": _turn_credit, "rollout_overlap": _rollout_overlap,
          "async_rollout": _async_rollout}  # what a script's summary must hold beyond being one


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_benchmark_runs_from_a_clone_in_its_quick_mode(script, tmp_path):
    if script.stem in NEEDS:
        pytest.importorskip(NEEDS[script.stem], reason=f"{NEEDS[script.stem]} is not installed")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # this checkout's agentrl
    env = {**os.environ, "PYTHONPATH": path, "AGENTRL_CACHE": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert isinstance(summary, dict) and summary
    CHECKS.get(script.stem, lambda s: None)(summary)
