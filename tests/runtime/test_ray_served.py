"""Served engines on the Ray runtime (runtime/ray/served.py), on a two-node cluster of this machine:
engine.kind=remote on an `agentrl serve` subprocess gives the local run's metrics, and
engine.kind=vllm starts its replicas' vLLM servers as Ray actors, trains on them and syncs them
(skipped, saying why, without the vLLM environment)."""

import os
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray")

from agentrl import cli  # noqa: E402
from agentrl.config import load_config  # noqa: E402
from agentrl.metrics import read_jsonl  # noqa: E402
from agentrl.runtime.local import train  # noqa: E402
from helpers import agentrl_serve  # noqa: E402
from test_ray_runtime import ENGINE_LOGPROB_KEYS, LAKE, cache, cluster  # noqa: E402,F401  (the module's fixtures)

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("AGENTRL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
# Warm-started enough that rewards differ within a group (as the Ray runtime's own equality tests)
SERVED = [*LAKE, "model.warm_start.max_steps=60", "rollout.batch_size=8", "rollout.group_size=4"]


def _rows(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def served(cache):
    """`agentrl serve` of the runs' own config in a subprocess, on loopback (its URL)."""
    with agentrl_serve("configs/frozen_lake.yaml", *SERVED, f"model.cache_dir={cache}", cwd=ROOT) as url:
        yield url


def test_a_ray_run_on_a_remote_engine_gives_the_local_runs_metrics(cluster, cache, served, tmp_path):
    """engine.kind=remote with runtime.kind=ray: no engine replica is placed, the env manager
    generates on engine.urls, trainer rank 0 pushes version 0 and then every update to the server;
    every metric but perf/ equals the local run's on the same server (the engine's own logprobs to
    the last float bits: the server batches requests as they arrive), and so does a step more
    after `agentrl resume` of each."""
    runs, logs = {}, []
    for kind in ("local", "ray"):
        cfg = load_config("configs/frozen_lake.yaml", [
            *SERVED, f"model.cache_dir={cache}", f"run_dir={tmp_path / kind}", f"runtime.kind={kind}",
            "engine.kind=remote", f"engine.urls=[{served}]", "engine.api_key=secret"])
        runs[kind] = train(cfg, log=logs.append)
        assert httpx.get(served + "/health").json()["policy_version"] == 3  # version 0, then each of 3 updates
    local, remote = _rows(tmp_path / "local"), _rows(tmp_path / "ray")
    assert [r["step"] for r in remote] == [r["step"] for r in local] == [0, 1, 2, 3, 3]
    assert any("actor_infer none (the servers of engine.urls)" in m and "reaching the engines by http" in m
               for m in logs), logs
    assert any(r.get("loss/policy") for r in local) and len({r.get("reward/mean") for r in local[1:4]}) > 1
    assert [r.keys() for r in remote] == [r.keys() for r in local]
    for mine, theirs in zip(remote, local):
        assert {k: v for k, v in mine.items() if k not in ENGINE_LOGPROB_KEYS} == \
            {k: v for k, v in theirs.items() if k not in ENGINE_LOGPROB_KEYS}
        assert all(mine[k] == pytest.approx(theirs[k], abs=1e-6) for k in ENGINE_LOGPROB_KEYS if k in mine)
    assert all(r["perf/engine_requests"] > 0 for r in read_jsonl(tmp_path / "ray" / "metrics.jsonl")
               if "reward/mean" in r)  # the server's own count of the env manager's requests
    assert runs["ray"]["eval_success_after"] == runs["local"]["eval_success_after"]
    # `agentrl resume` of each, one step more: the server continues from the checkpoint's version
    for kind in ("local", "ray"):
        assert cli.main(["resume", str(tmp_path / kind), "trainer.total_steps=4"]) == 0
        assert httpx.get(served + "/health").json()["policy_version"] == 4
    local, remote = _rows(tmp_path / "local"), _rows(tmp_path / "ray")
    assert [r["step"] for r in remote] == [r["step"] for r in local] == [0, 1, 2, 3, 3, 4, 4]
    assert [{k: v for k, v in r.items() if k not in ENGINE_LOGPROB_KEYS} for r in remote[5:]] == \
        [{k: v for k, v in r.items() if k not in ENGINE_LOGPROB_KEYS} for r in local[5:]]


def _local_and_ray(served, cache, tmp_path, extra):
    """The rows (perf/ aside) of a local run and a Ray run of SERVED + `extra` on the server `served`."""
    for kind in ("local", "ray"):
        cfg = load_config("configs/frozen_lake.yaml", [
            *SERVED, *extra, f"model.cache_dir={cache}", f"run_dir={tmp_path / kind}", f"runtime.kind={kind}",
            "engine.kind=remote", f"engine.urls=[{served}]", "engine.api_key=secret"])
        train(cfg, log=lambda m: None)
        assert httpx.get(served + "/health").json()["policy_version"] == 3  # version 0, then each of 3 updates
    local, remote = _rows(tmp_path / "local"), _rows(tmp_path / "ray")
    assert [r["step"] for r in remote] == [r["step"] for r in local] == [0, 1, 2, 3, 3]
    return local, remote


def test_lora_on_a_remote_engine_gives_the_local_runs_metrics_on_ray(cluster, cache, served, tmp_path):
    """LoRA with engine.kind=remote, once refused: version 0 is the base weights (which also clear
    what an earlier run's adapters left on the server), then each update pushes the adapter to
    the server's /agentrl/adapter route. On Ray every metric but perf/ equals the local run's (the
    engine's own logprobs to the last float bits, as above), and the server generated with each
    adapter the trainer pushed: its logprobs are the trainer's, to float noise."""
    local, remote = _local_and_ray(served, cache, tmp_path, ["model.lora.rank=4", "model.lora.alpha=8",
                                                              "actor.lr=0.05"])
    assert any(r.get("loss/policy") for r in local) and [r.keys() for r in remote] == [r.keys() for r in local]
    for mine, theirs in zip(remote, local):
        assert {k: v for k, v in mine.items() if k not in ENGINE_LOGPROB_KEYS} == \
            {k: v for k, v in theirs.items() if k not in ENGINE_LOGPROB_KEYS}
        assert all(mine[k] == pytest.approx(theirs[k], abs=1e-6) for k in ENGINE_LOGPROB_KEYS if k in mine)
    assert all(r["policy/logprob_diff_max"] < 1e-4 for r in local if "reward/mean" in r)


def test_asynchronous_rollout_on_a_remote_engine_trains_on_ray_within_the_bound(cluster, cache, served, tmp_path):
    """Asynchronous rollout with a served engine on Ray, once refused, trains every step within the
    staleness bound, every trained id stamped with its version, nothing lost; the first evaluation
    (before any update) equals the local run's. Not the later values: which group ends first on a
    server follows its timing, locally as on Ray, and the stream admits groups as they end."""
    local, remote = _local_and_ray(served, cache, tmp_path, ["rollout.max_staleness=1",
                                                              "rollout.stale_samples=correct"])
    assert remote[0] == local[0]
    trained = [r for r in remote if "reward/mean" in r]
    assert [r["step"] for r in trained] == [1, 2, 3] and all(r.get("loss/policy") is not None for r in trained)
    assert all(r["rollout/staleness_max"] <= 1 and r["rollout/version_coverage"] == 1.0 for r in trained)
    assert all(r["rollout/discarded_tokens/failed"] == 0 and r["rollout/failed_episodes"] == 0 for r in trained)


# The embedded default, smaller (head size 32, as vLLM's CPU attention takes), 2 steps (tests/e2e/test_vllm_launch.py)
VLLM_SMALL = ["model.tiny.num_hidden_layers=1", "model.tiny.vocab_size=300", "model.warm_start.max_steps=4",
              "model.warm_start.batch_size=4", "rollout.batch_size=4", "rollout.group_size=2",
              "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2", "env.max_turns=2", "env.args.max_steps=2",
              "rollout.max_new_tokens=12", "trainer.total_steps=2", "trainer.test_freq=0", "trainer.eval_episodes=2",
              "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]"]


@pytest.mark.skipif(not Path(VLLM_PYTHON).is_file(), reason=f"no vLLM environment at {VLLM_PYTHON}: run `make vllm` "
                    "(or set AGENTRL_VLLM_PYTHON)")
def test_a_ray_run_on_vllm_starts_a_server_per_replica_syncs_it_and_restarts_it_when_killed(cluster, cache, tmp_path):
    """engine.kind=vllm with runtime.kind=ray: the actor_infer replica starts a vLLM server (the CPU
    build here) from the embedded policy the driver wrote, the env manager generates on it, trainer
    rank 0 pushes every update through vLLM's weight transfer and checks it on the probe (the
    server's version label and its logprobs of fixed ids). The env kills the server in step 2: it
    is started again, given version 1 before it serves, and the run trains on; every server stops
    with the run."""
    run, logs = tmp_path / "run", []
    cfg = load_config("configs/frozen_lake.yaml", [
        *VLLM_SMALL, f"model.cache_dir={cache}", f"run_dir={run}", "runtime.kind=ray", "engine.kind=vllm",
        f"engine.vllm.python={VLLM_PYTHON}", "engine.vllm.args=[--enforce-eager]", "runtime.restart_timeout=1800",
        f"imports=[{Path(__file__).parent / 'vllm_replica_env.py'}]", "env.type=replica_killing_lake",
        f"env.args.kill_after={run / 'vllm' / 'vllm-weights' / 'policy-v1.safetensors'}",
        f"env.args.model={run / 'vllm' / 'model'}"])
    summary = train(cfg, log=logs.append)
    assert summary["steps"] == 2 and (run / "vllm" / "killed").exists()
    assert any("actor_infer 1 (1 CPU each) starting vLLM servers" in m for m in logs), logs
    assert any("weights by vLLM's weight transfer (file)" in m for m in logs), logs
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    # every push (versions 1 and 2) was labelled and scored by the server as the trainer scores it
    assert [r["step"] for r in rows] == [1, 2] and all(r["policy/engine_probe_diff"] <= 1e-3 for r in rows)
    assert [r["perf/vllm_restarts"] for r in rows] == [0.0, 1.0]  # restarted in step 2, which then trained
    assert all(r["rollout/response_tokens"] > 0 for r in rows) and rows[0]["rollout/errors"] == 0
    # the restarted server labelled its ids with version 1 before any episode reached it
    assert all(r["rollout/staleness_max"] == 0 for r in rows)
    assert (run / "vllm" / "model" / "config.json").is_file()
    logs = sorted((run / "vllm" / "replica-0").glob("vllm-*.log"))
    assert len(logs) == 2  # the first server, and the one started after it died
    for log in logs:
        port = int(log.stem.split("-")[1])
        for host in ("127.0.0.1", ray.util.get_node_ip_address()):  # stopped with the run
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://{host}:{port}/health", timeout=5)
    print(f"vLLM server killed in step 2: {rows[1]['rollout/errors']:g} episode attempts failed and were retried; "
          f"groups dropped {rows[1].get('rollout/dropped_groups', 0):g}")


@pytest.mark.skipif(not Path(VLLM_PYTHON).is_file(), reason=f"no vLLM environment at {VLLM_PYTHON}: run `make vllm` "
                    "(or set AGENTRL_VLLM_PYTHON)")
def test_lora_on_the_run_s_vllm_replicas_trains_on_ray(cluster, cache, tmp_path):
    """model.lora.rank=8 with engine.kind=vllm on Ray: version 0 is the base weights, each update is
    loaded into the replica's server as a LoRA adapter (`policy-vN`), which the env manager's
    requests then name and whose version they carry; the probe (the adapter's logprobs of fixed ids
    against the trainer's) passes after every push."""
    run = tmp_path / "run"
    cfg = load_config("configs/frozen_lake.yaml", [
        *VLLM_SMALL, "model.lora.rank=8", "actor.lr=5e-3", f"model.cache_dir={cache}", f"run_dir={run}",
        "runtime.kind=ray", "engine.kind=vllm", f"engine.vllm.python={VLLM_PYTHON}",
        "engine.vllm.args=[--enforce-eager]", "runtime.restart_timeout=1800"])
    assert train(cfg, log=lambda m: None)["steps"] == 2
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["policy/engine_probe_diff"] <= 1e-3 for r in rows)
    assert all(r["rollout/staleness_max"] == 0 and r["rollout/response_tokens"] > 0 for r in rows)
    adapters = sorted(p.name for p in (run / "vllm" / "vllm-weights").iterdir() if p.is_dir())
    assert adapters == ["policy-v1", "policy-v2"]  # the adapters the server holds (the newest two)
