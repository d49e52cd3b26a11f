"""benchmarks/gpu_suite.py on CPU: the reduced shape runs every section and ends with its JSON line
(a smoke run: the numbers of a reduced shape on CPU say nothing about a GPU)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_the_gpu_suite_smokes_on_cpu(tmp_path):
    res = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--device", "cpu", "--quick",
                          "--model-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    (shape,) = summary["shapes"].values()
    assert summary["quick"] and summary["device"] == "cpu"
    assert shape["rollout"]["generated_tokens"] > 0 and shape["rollout"]["speedup_vs_lockstep"] > 0
    gap = shape["precision"]["gap"]
    assert gap["fp32"]["max"] >= 0 and gap["bf16_weights"]["mean"] >= 0
    update = shape["update"]
    assert update["full"]["tokens_per_s"] > 0 and update["lora"]["tokens_per_s"] > 0
    assert update["sync"]["lora"]["tensor_elements"] < update["sync"]["full"]["tensor_elements"]
    assert shape["staleness"]["k0_step_seconds"] > 0 and shape["staleness"]["k1_step_seconds"] > 0
