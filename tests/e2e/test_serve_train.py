"""End to end with a tiny budget: `agentrl train` generating on an `agentrl serve` subprocess
(engine.kind=remote), with serve.api_key or with the admin key a server without one writes to
its run folder (and prints where, never the key); what such a server does with a 1 GiB weights body (refuses it without
holding it); and training the OpenAI-client FrozenLake example (agent.type=openai)."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import psutil
import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train
from helpers import agentrl_serve

ROOT = Path(__file__).parents[2]
TINY = [
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "env.max_turns=3", "env.args.max_steps=3", "trainer.total_steps=2", "trainer.test_freq=1",
    "trainer.eval_episodes=2", "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]",
]


@pytest.fixture(scope="module")
def cache_dir(run_model_cache):
    return run_model_cache  # the test run's: a warm start other modules share


@pytest.fixture(scope="module")
def served(cache_dir):
    """`agentrl serve` of the tiny config in a subprocess (a free port, read from its first line)."""
    with agentrl_serve("configs/frozen_lake.yaml", *TINY, f"model.cache_dir={cache_dir}", cwd=ROOT) as url:
        yield url


@pytest.fixture(scope="module")
def keyless(cache_dir, tmp_path_factory):
    """`agentrl serve` without serve.api_key: (url, the admin key its key file holds, that file, the
    process, what it printed on stdout before serving); at its stop, nothing it printed held the key."""
    run_dir = tmp_path_factory.mktemp("serve_run")
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve", "configs/frozen_lake.yaml", *TINY,
                             "serve.port=0", f"run_dir={run_dir}", f"model.cache_dir={cache_dir}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []  # its first two lines, read aside: a server that prints fewer must fail the test, not hang it
    first_line = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    first_line.start()
    first_line.join(600)  # the model is built first
    second_line = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    second_line.start()
    second_line.join(60)  # printed right after the first
    first, second = (lines + ["", ""])[:2]
    found = re.match(r"agentrl serve: admin key .* engine.api_key_file=(\S+)$", second.strip())
    if not first.startswith("agentrl serve: ") or found is None:
        proc.kill()
        pytest.fail(f"agentrl serve did not print its URL and admin key file: {first}{second}"
                    f"{proc.stderr.read()[-2000:]}")
    key_file = Path(found.group(1))
    key = key_file.read_text().strip()
    yield first.split()[2], key, key_file, proc, first + second
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert not key_file.exists()  # the key dies with the server
    assert key not in out + err  # nor was it printed later


def test_a_server_without_a_key_prints_where_its_admin_key_is_never_the_key(keyless):
    url, key, key_file, _, printed = keyless
    assert len(key) >= 32 and key not in printed and str(key_file) in printed  # stdout ends up in logs
    assert key_file.parent.name.startswith("serve_run") and key_file.name == f"serve-{url.rsplit(':', 1)[1]}.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.read_text().strip() == key
    assert httpx.get(url + "/v1/models").status_code == 200  # generation stays open to this machine
    assert httpx.post(url + "/agentrl/state", json={"policy_version": 5}).status_code == 401
    assert httpx.post(url + "/agentrl/state", json={"policy_version": 0},
                      headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_training_on_a_server_without_a_key_pushes_with_its_admin_key_file(keyless, cache_dir, tmp_path):
    url, _, key_file, _, _ = keyless
    remote = [*TINY, f"model.cache_dir={cache_dir}", "engine.kind=remote", f"engine.urls=[{url}]"]
    with pytest.raises(ConfigError) as err:  # without the key: refused before any model is built
        train(load_config("configs/frozen_lake.yaml", [*remote, f"run_dir={tmp_path / 'no_key'}"]), log=lambda m: None)
    assert "refused the admin key" in str(err.value) and "engine.api_key_file" in str(err.value)
    before = httpx.get(url + "/health").json()["policy_version"]
    cfg = load_config("configs/frozen_lake.yaml", [*remote, f"run_dir={tmp_path / 'run'}",
                                                    f"engine.api_key_file={key_file}"])
    assert train(cfg, log=lambda m: None)["steps"] == 2
    assert before == 0 and httpx.get(url + "/health").json()["policy_version"] == 2
    assert str(key_file) in (tmp_path / "run" / "config.yaml").read_text()  # the file's name, not the key
    assert key_file.read_text().strip() not in (tmp_path / "run" / "config.yaml").read_text()


def _peak_rss(pid):
    """The process's peak resident memory since the last reset (Linux's VmHWM)."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _push_stream(url, size, headers):
    """Stream `size` bytes to the weight route (no Content-Length; this side never holds them): the
    status read, or None when the server closed the connection mid-upload (past what it drains)."""
    chunk = bytes(2**20)

    def body():
        for _ in range(size // len(chunk)):
            yield chunk
    try:
        return httpx.post(url + "/agentrl/weights?version=3", content=body(), timeout=300,
                          headers={"content-type": "application/octet-stream", **headers}).status_code
    except httpx.TransportError:
        return None


def test_a_1gib_weights_body_is_refused_without_the_server_holding_it(keyless):
    url, key, _, proc, _ = keyless
    server = psutil.Process(proc.pid)
    version = httpx.get(url + "/health").json()["policy_version"]
    for headers, refusal in (({}, 401), ({"Authorization": f"Bearer {key}"}, 413)):
        assert _push_stream(url, 8 * 2**20, headers) == refusal  # the same path once, small
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # restart the peak from here
        before = server.memory_info().rss
        assert _push_stream(url, 2**30, headers) in (refusal, None)
        grown = _peak_rss(proc.pid) - before
        assert grown < 16 * 2**20, f"the server's memory grew by {grown / 2**20:.0f} MiB for a refused 1 GiB body"
    assert httpx.get(url + "/health").json()["policy_version"] == version  # and nothing was loaded


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


def test_an_entry_named_by_module_from_imports_trains_and_resumes_as_the_readme_says(cache_dir, tmp_path, capsys):
    """`imports=[path/my_agent.py] "agent.args={entry: my_agent:run}"`, the file in a folder of its
    own (not where the command runs): the module is importable by its name, in the run and in
    `agentrl resume`. The run is the CLI's entry point in this process; the resume, a process of its
    own, imports the module afresh from what the run folder says."""
    from agentrl.cli import main

    folder = tmp_path / "agents"
    folder.mkdir()
    (folder / "my_agent.py").write_text((ROOT / "examples" / "openai_frozen_lake.py").read_text())
    run = tmp_path / "run"
    code = main(["train", str(ROOT / "configs" / "frozen_lake.yaml"), *TINY, "trainer.save_freq=1",
                 f"imports=[{folder / 'my_agent.py'}]", "agent.type=openai", "agent.args={entry: my_agent:run}",
                 f"run_dir={run}", f"model.cache_dir={cache_dir}"])
    assert code == 0, capsys.readouterr().err[-3000:]
    res = subprocess.run([sys.executable, "-m", "agentrl.cli", "resume", str(run), "trainer.total_steps=3"],
                         capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/episodes"] == 4 and r["rollout/errors"] == 0 and r["rollout/response_tokens"] > 0
               for r in rows)
