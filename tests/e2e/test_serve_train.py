"""End to end with a tiny budget: `agentrl train` generating on an `agentrl serve` subprocess
(engine.kind=remote), and training the OpenAI-client FrozenLake example (agent.type=openai)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

ROOT = Path(__file__).parents[2]
TINY = [
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "env.max_turns=3", "env.args.max_steps=3", "trainer.total_steps=2", "trainer.test_freq=1",
    "trainer.eval_episodes=2", "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("model_cache")


@pytest.fixture(scope="module")
def served(cache_dir):
    """`agentrl serve` of the tiny config in a subprocess (a free port, read from its first line)."""
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve", "configs/frozen_lake.yaml", *TINY,
                             "serve.port=0", "serve.api_key=secret", f"model.cache_dir={cache_dir}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()
    if not line.startswith("agentrl serve: "):
        proc.kill()
        pytest.fail(f"agentrl serve did not start: {line}{proc.stderr.read()[-2000:]}")
    yield line.split()[2]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # a clean stop on SIGTERM


def test_training_generates_on_an_agentrl_serve_subprocess(served, cache_dir, tmp_path):
    cfg = load_config("configs/frozen_lake.yaml", [*TINY, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={cache_dir}",
                                                    "engine.kind=remote", f"engine.urls=[{served}]",
                                                    "engine.api_key=secret"])
    summary = train(cfg, log=lambda m: None)
    assert summary["steps"] == 2
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["perf/remote_requests"] > 0 and r["perf/engine_requests"] == r["perf/remote_requests"] for r in rows)
    assert all(r["rollout/staleness_max"] == 0 for r in rows)  # every id came from the version just pushed
    health = httpx.get(served + "/health").json()
    assert health["policy_version"] == 2  # the run pushed its weights after each of its 2 steps
    assert httpx.get(served + "/v1/models").status_code == 401  # the key guards the rest


def test_the_openai_client_example_trains(cache_dir, tmp_path):
    cfg = load_config("configs/frozen_lake.yaml", [*TINY, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={cache_dir}",
                                                    "agent.type=openai",
                                                    "agent.args.entry=examples/openai_frozen_lake:run"])
    summary = train(cfg, log=lambda m: None)
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert summary["steps"] == 2 and len(rows) == 2
    assert all(r["rollout/segments"] == 0 and r["rollout/episodes"] == 4 and r["rollout/errors"] == 0 for r in rows)
    assert all(r["rollout/response_tokens"] > 0 for r in rows)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 2
