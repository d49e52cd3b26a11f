"""Elastic rollout on Ray (runtime/ray/elastic.py), on test_ray_runtime.py's two-node cluster: a run
scaled 1 -> 2 -> 1 engine replicas mid-run. The env itself runs `agentrl scale` during given
training steps, so each request lands at the next step boundary whatever the machine's load."""

import pytest

ray = pytest.importorskip("ray")

import ray_envs  # noqa: E402,F401  (registers coin, for this process and the actors)
from agentrl.config import load_config  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402
from agentrl.metrics import read_jsonl  # noqa: E402
from agentrl.runtime.local import open_run  # noqa: E402
from test_ray_runtime import COIN, _model, cache, cluster  # noqa: E402,F401  (its module fixtures)

pytestmark = pytest.mark.ray


# Over HTTP the env manager's new client reaches the new replica's server (started on first use).
@pytest.mark.parametrize("transport", ["ray", pytest.param("http", marks=pytest.mark.slow)])
def test_a_run_scaled_1_2_1_mid_run_trains_every_step_on_the_current_policy(cluster, cache, tmp_path, transport):
    """COIN, 3 steps, one engine placed. The env runs `agentrl scale RUN engines=2` during step 1
    and `engines=1` during step 2: step 2 plays on 2 replicas, the new one built, given step 1's
    weights and version and bound to the env manager at step 2's boundary; step 3 on 1 again.
    Every step trains; no episode fails; each replica serves; every generated token carries the
    version the trainer holds (staleness 0) and its logprob matches the trainer's (the weights,
    not only the label, are current); the added replica's placement group is given back.
    `RayRun.scale` asks the same from Python (here before fit: 1, the count placed, a no-op)."""
    model = _model(cache, COIN)
    marker, run_dir = tmp_path / "marker", tmp_path / "run"
    marker.mkdir()
    cfg = load_config(None, [*COIN, f"model.path={model}", f"run_dir={run_dir}", "runtime.kind=ray",
                             f"env.args.marker={marker}", f"env.args.run_dir={run_dir}",
                             "env.args.scales=[[1, 2], [9, 1]]", f"runtime.engine_transport={transport}"])
    logs = []
    with open_run(cfg, log=logs.append) as run:
        with pytest.raises(ConfigError, match=r"^engines=0: give a whole number"):
            run.scale(0)
        run.scale(1)
        summary = run.fit()
    assert summary["steps"] == 3
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["ray/engine_replicas"] for r in rows] == [1.0, 2.0, 1.0]
    assert all(r["ray/engine_requests_min"] > 0 for r in rows)  # step 2: the new replica served too
    assert all(r["rollout/staleness_max"] == 0 for r in rows)
    print("policy/logprob_diff_max per step:", [r["policy/logprob_diff_max"] for r in rows])
    assert all(r["policy/logprob_diff_max"] < 1e-4 for r in rows)
    assert sum(r.get("rollout/failures_engine", 0) + r.get("rollout/failed_episodes", 0) for r in rows) == 0
    assert all(r.get("loss/policy") is not None for r in rows)
    assert [p["state"] for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"] == []



def test_an_asynchronous_run_is_scaled_1_2_1_between_two_batches_and_trains_every_step(cluster, cache, tmp_path):
    """COIN, rollout.max_staleness=1, 4 steps of 2 groups, one engine placed. The stream plays
    steps 1-2 as its first batch (both admitted at version 0), then one step per batch; the env
    asks for 2 replicas at its first episode (batch 1) and for 1 at its 17th (the first of batch
    2). Each request is applied before the next batch starts, every env manager idle then: the
    run reaches 2 replicas and ends on 1, trains every step within the staleness bound, fails no
    episode, and every id it trains carries the version that produced it."""
    model = _model(cache, COIN)
    marker, run_dir = tmp_path / "marker", tmp_path / "run"
    marker.mkdir()
    cfg = load_config(None, [*COIN, f"model.path={model}", f"run_dir={run_dir}", "runtime.kind=ray",
                             f"env.args.marker={marker}", f"env.args.run_dir={run_dir}",
                             "env.args.scales=[[1, 2], [17, 1]]", "rollout.max_staleness=1",
                             "rollout.stale_samples=correct", "trainer.total_steps=4"])
    with open_run(cfg, log=lambda m: None) as run:
        summary = run.fit()
    assert summary["steps"] == 4
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    print("replicas per step:", [(r["ray/engine_replicas"], r["ray/engine_replicas_max"]) for r in rows])
    assert max(r["ray/engine_replicas_max"] for r in rows) == 2.0 and rows[-1]["ray/engine_replicas"] == 1.0
    assert all(r["rollout/staleness_max"] <= 1 for r in rows)
    assert all(r["rollout/version_coverage"] == 1.0 for r in rows)
    assert sum(r.get("rollout/failures_engine", 0) + r.get("rollout/failed_episodes", 0) for r in rows) == 0
    assert all(r.get("loss/policy") is not None for r in rows)
    assert [p["state"] for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"] == []
