"""Every script in benchmarks/ runs from a fresh clone in its quickest mode (`--quick`), as a user
runs it: a process of its own, started outside the checkout with an empty model cache, ending
with its JSON summary line. A smoke run: no timing is asserted (a reduced budget on a shared CPU
says nothing about speed). A new script is covered by being in the folder."""

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


CHECKS = {"gpu_suite": _gpu_suite, "prefix_sharing": _prefix_sharing, "elastic": _elastic,
          "update_memory": _update_memory}  # what a script's summary must hold beyond being one


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
