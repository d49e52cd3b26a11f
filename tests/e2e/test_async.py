"""Asynchronous training end to end: staleness stays within k at every step, through faults
and through a SIGKILL and resume."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main as cli_main
from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

from test_resume import KILLER  # tests/e2e is on sys.path (pytest prepend mode)
from test_train import TINY

ROOT = Path(__file__).parents[2]
ASYNC = [*TINY, "rollout.batch_size=8", "rollout.group_size=2", "actor.ppo_mini_batch_size=8",
         "trainer.total_steps=4", "trainer.test_freq=2"]


def _step_rows(run: Path) -> list[dict]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if "rollout/kept_groups" in r]


@pytest.fixture(scope="module")
def cache(run_model_cache):
    return run_model_cache  # the test run's: a warm start other modules share


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_never_exceeds_k(tmp_path, cache, k):
    cfg = load_config("configs/frozen_lake.yaml", [*ASYNC, f"rollout.max_staleness={k}", f"run_dir={tmp_path}",
                                                   f"model.cache_dir={cache}"])
    assert cfg.actor.use_decoupled_loss  # stale samples are corrected
    summary = train(cfg, log=lambda m: None)
    rows = _step_rows(tmp_path)
    assert summary["steps"] == 4 and [r["step"] for r in rows] == [1, 2, 3, 4]
    # The trainer also asserts the bound on every generated id of every batch it trains on.
    assert all(r["rollout/staleness_max"] <= k for r in rows)
    assert max(r["rollout/staleness_max"] for r in rows) >= 1  # rollout really ran ahead
    assert all(r["rollout/kept_groups"] == 4 for r in rows)
    assert all("policy/is_weight_mean" in r for r in rows)  # decoupled PPO weights were applied


def test_killed_async_run_resumes_within_the_bound(tmp_path, cache, capsys):
    run = tmp_path / "run"
    args = ["train", "configs/frozen_lake.yaml", *ASYNC, "rollout.max_staleness=1", f"run_dir={run}",
            f"model.cache_dir={cache}", "trainer.save_freq=1", "trainer.total_steps=5"]
    res = subprocess.run([sys.executable, "-c", KILLER, "update", "4", *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    # `agentrl resume` through the CLI's entry point, in this process (tests/e2e/test_resume.py
    # resumes in a process of its own): the bound is the trainer's, whichever process runs it
    code = cli_main(["resume", str(run)])
    assert code == 0, capsys.readouterr().err[-2000:]
    rows = _step_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["rollout/staleness_max"] <= 1 for r in rows)
