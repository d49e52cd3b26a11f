"""The Ray runtime end to end, on a cluster of two nodes of 2 logical CPUs each
(ray.cluster_utils.Cluster: two raylets on this machine), no GPU, started once per test process
(tests/conftest.py) and joined by each Ray module as a job of its own. The same metrics as the
local runtime; data-parallel training equal to one worker; a dead trainer rank stopping the run
and `agentrl resume` continuing it; an engine and an env manager killed mid-run and restarted,
in a run whose engine sits on the second node; impossible placements refused in one line; LoRA
(adapter-sized weight sync, resume, two ranks) and OpenAI-client agents as in the local runtime."""

import json
import time
from collections import Counter

import pytest
import torch

ray = pytest.importorskip("ray")

import ray_envs  # noqa: E402,F401  (registers coin and sabotaged_lake, for this process and the actors)
from agentrl import cli  # noqa: E402
from agentrl.api import AgentTrainer, fit  # noqa: E402
from agentrl.config import load_config  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402
from agentrl.metrics import read_jsonl  # noqa: E402
from agentrl.models.embedded import cache_root, tiny_cache_key  # noqa: E402
from agentrl.runtime.assembly.policy import load_policy  # noqa: E402
from agentrl.runtime.local import train  # noqa: E402
from agentrl.runtime.assembly.plan import plan  # noqa: E402
from agentrl.runtime.ray.driver import init_cluster  # noqa: E402
from agentrl.runtime.ray.weight_sync import ObjectStoreTransport  # noqa: E402
from helpers import without_plan  # noqa: E402

pytestmark = pytest.mark.ray

TINY = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
        "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
        "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
        "trainer.total_steps=3", "trainer.test_freq=2", "trainer.eval_episodes=2", "trainer.save_freq=1",
        "trainer.progress=false", "trainer.logger=[jsonl]"]
# Warm-started enough that replies end (a cut-off reply is empty, and pays the same as any other).
COIN = [*TINY, "env.type=coin", "env.max_turns=1", "model.warm_start.max_steps=60", "rollout.batch_size=8",
        "rollout.group_size=4"]
LAKE = [*TINY, "env.max_turns=3", "env.args.max_steps=3"]
# configs/frozen_lake.yaml's runs whose metrics are compared: warm-started enough that rewards
# differ within a group (so the loss is not 0), in 2 groups of 4.
LAKE_WARM = [*LAKE, "model.warm_start.max_steps=60", "rollout.batch_size=8", "rollout.group_size=4"]


@pytest.fixture(scope="module")
def cluster(ray_nodes):
    """The two-node cluster of this pytest-xdist worker (tests/conftest.py's `ray_nodes`, shared by
    the Ray modules), joined by this module as a Ray job of its own: at the module's end the driver
    disconnects, which ends the job and with it every actor and placement group it left, so each
    module starts on an empty cluster as if the cluster were its own."""
    with ray_nodes.env():
        init_cluster(address=ray_nodes.address)
        try:
            _wait_idle()
            yield ray_nodes
        finally:
            ray.shutdown()


def _wait_idle(limit: float = 300.0) -> None:
    """Until the jobs of the modules before this one are gone: Ray ends a disconnected job's
    actors and placement groups after the disconnect returns, and a module sees every CPU free."""
    deadline = time.monotonic() + limit
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU") or any(
            p["state"] != "REMOVED" for p in ray.util.placement_group_table().values()):
        assert time.monotonic() < deadline, f"the shared Ray cluster is still busy: {ray.available_resources()}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cache(run_model_cache):
    """The test run's model cache: the Ray modules (and both workers) warm-start each config once."""
    return run_model_cache


def _model(cache, overrides):
    """A warm-started tiny model folder (for model.path: both runtimes load the same weights)."""
    cfg = load_config(None, [*overrides, f"model.cache_dir={cache}"])
    load_policy(plan(cfg), log=lambda m: None)
    return cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"


def _rows(run_dir):
    """metrics.jsonl without perf/ (clocks) and ray/ (the Ray run's own: replica counts)."""
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "ray/"))}
            for r in read_jsonl(run_dir / "metrics.jsonl")]


def _fit_lake(cache, run_dir, kind, overrides, process_threads):
    """`agentrl.api.fit` of configs/frozen_lake.yaml (LAKE_WARM and `overrides`) on runtime `kind`,
    called from a process of `process_threads` torch threads, which it asserts the run gave back;
    the run's summary."""
    before = torch.get_num_threads()
    torch.set_num_threads(process_threads)
    try:
        summary = fit("configs/frozen_lake.yaml", overrides=[*LAKE_WARM, *overrides, f"model.cache_dir={cache}",
                                                           f"run_dir={run_dir}", f"runtime.kind={kind}"],
                      log=lambda m: None)
        assert torch.get_num_threads() == process_threads
    finally:
        torch.set_num_threads(before)
    return summary


@pytest.fixture(scope="module")
def lake_local(cache, tmp_path_factory):
    """(run folder, summary) of the local run of configs/frozen_lake.yaml (LAKE_WARM), called from a
    process of 2 torch threads: the one baseline that the Ray runs of that config compare to (it
    does not depend on the caller's thread count: the run pins its own, runtime.num_threads)."""
    run_dir = tmp_path_factory.mktemp("lake") / "local"
    return run_dir, _fit_lake(cache, run_dir, "local", [], 2)


def test_the_object_store_transport_round_trip(cluster):
    transport = ObjectStoreTransport()
    sent = {"w": torch.randn(3, 4), "b": torch.randn(4).to(torch.bfloat16), "tied": None}
    sent["tied"] = sent["w"]
    payload = transport.send(sent, version=2)
    with transport.receive(payload) as got:
        assert all(got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in sent.items())
    transport.release(payload)
    assert payload.version == 2 and not payload.refs


@pytest.mark.parametrize("process_threads, overrides", [
    (2, []),  # torch's own default on a machine of 2 cores (a Ray actor of 1 CPU is given 1); the run's default
    # a count the config sets reaches every process, actors included; ReMax: each group also plays
    # its greedy baseline episode on Ray (the Ray source once left them out, silently)
    (1, ["runtime.num_threads=2", "algorithm.adv_estimator=remax"]),
], ids=["default", "num_threads=2-remax"])
def test_the_local_and_ray_runtimes_log_identical_metrics(cluster, cache, tmp_path, request, process_threads,
                                                        overrides):
    """configs/frozen_lake.yaml, warm-started here, 3 steps through `agentrl.api.fit` on each
    runtime, from a process whose own torch thread count is not the run's: every logged value but
    the perf/ clocks is identical, and the caller's thread count is given back after each run
    (the default config's local run is the module's `lake_local`, called as this one's would be)."""
    if overrides:
        local_dir = tmp_path / "local"
        _fit_lake(cache, local_dir, "local", overrides, process_threads)
    else:
        local_dir = request.getfixturevalue("lake_local")[0]
    _fit_lake(cache, tmp_path / "ray", "ray", overrides, process_threads)
    local, remote = _rows(local_dir), _rows(tmp_path / "ray")
    assert [r["step"] for r in remote] == [r["step"] for r in local] == [0, 1, 2, 3, 3]
    differ = [(theirs["step"], k) for mine, theirs in zip(remote, local) for k in mine.keys() | theirs.keys()
              if mine.get(k) != theirs.get(k)]
    assert differ == [] and any(r.get("loss/policy") for r in local)
    if "algorithm.adv_estimator=remax" in overrides:
        assert all("reward/greedy_baseline" in r for r in remote if r["step"] and "loss/policy" in r)


PPO = ["algorithm.adv_estimator=gae", "critic.enable=true", "critic.ppo_mini_batch_size=4", "critic.micro_batch_size=2",
       "actor.use_kl_loss=true"]
# Metrics of the engine's own logprobs: over HTTP a replica batches requests as they arrive, and a
# row's logprob can differ in its last float bits with the rows beside it (its sampled ids cannot:
# seeds travel with the requests). Every other metric is computed from the ids.
ENGINE_LOGPROB_KEYS = ("policy/logprob_diff_mean", "policy/logprob_diff_max")


@pytest.mark.parametrize("config, overrides, transport", [
    (None, [*COIN, *PPO], "ray"),  # PPO with a critic and a KL loss to the reference, in actors of their own
    # multi-turn, warm-started enough that rewards differ within a group: sticky routing, prefix cache
    ("configs/frozen_lake.yaml", LAKE_WARM, "http"),
], ids=["coin-ppo-ray", "frozen_lake-http"])
def test_one_trainer_engine_and_env_manager_give_the_local_metrics(cluster, cache, tmp_path, request, config,
                                                                  overrides, transport):
    """The embedded model (shipped to the actors through the object store), 3 steps on an env
    whose rewards differ within a group, the engine reached by Ray actor calls or over HTTP
    (runtime.engine_transport): every non-perf metric equals the local run's (for
    configs/frozen_lake.yaml, the module's `lake_local`: the same config and overrides)."""
    runs, logs = {}, []
    if config is None:
        local_dir = tmp_path / "local"
        runs["local"] = train(load_config(config, [*overrides, f"model.cache_dir={cache}", f"run_dir={local_dir}",
                                                   "runtime.kind=local"]), log=logs.append)
    else:
        local_dir, runs["local"] = request.getfixturevalue("lake_local")
    cfg = load_config(config, [*overrides, f"model.cache_dir={cache}", f"run_dir={tmp_path / 'ray'}",
                               "runtime.kind=ray", f"runtime.engine_transport={transport}"])
    runs["ray"] = train(cfg, log=logs.append)
    local, remote = _rows(local_dir), _rows(tmp_path / "ray")
    assert [r["step"] for r in remote] == [0, 1, 2, 3, 3]
    assert any(r.get("loss/policy") for r in local) and any(f"reaching the engines by {transport}" in m for m in logs)
    if transport == "ray":
        assert any(r.get("loss/kl") for r in local[2:]) and any(r.get("loss/value") for r in local), "the critic learned"
        assert remote == local
    else:
        assert [r.keys() for r in remote] == [r.keys() for r in local]
        for mine, theirs in zip(remote, local):
            assert {k: v for k, v in mine.items() if k not in ENGINE_LOGPROB_KEYS} == \
                {k: v for k, v in theirs.items() if k not in ENGINE_LOGPROB_KEYS}
            assert all(mine[k] == pytest.approx(theirs[k], abs=1e-6) for k in ENGINE_LOGPROB_KEYS if k in mine)
    # Start-up is reported (its value is a timing: on a warm cluster it rounds to 0.0).
    assert runs["ray"]["ray_start_seconds"] >= 0 and runs["ray"]["eval_success_after"] == runs["local"]["eval_success_after"]


def test_two_trainer_ranks_update_as_one_and_a_dead_rank_stops_the_run_until_resume(cluster, cache, tmp_path, capsys):
    """`agentrl train --config-path/--config-name` with actor_train.world_size=2, two env managers,
    and an env from a file in `imports` (one Ray run and its resume prove both):

    - step 1's loss and weights equal one worker's; rank 1 killed during step 2 stops the run with
      one line naming it; `agentrl resume` finishes the run (to a longer trainer.total_steps);
    - `imports=[path/my_coin.py]`: the driver and every actor (two env managers) import the file as
      module `my_coin` (actors import it themselves: its registrations do not travel pickled);
    - plan.json of the run equals `agentrl plan --json` of its config, the placement's workers and
      bundles included, and the run logs the plan's text."""
    model = _model(cache, COIN)
    (tmp_path / "mine").mkdir()
    module = tmp_path / "mine" / "my_coin.py"  # ray_envs: importable by the actors (tests/runtime is on their path)
    module.write_text("from agentrl.registry import register_env\nfrom ray_envs import CoinEnv\n"
                      "\n\n@register_env('my_coin')\nclass MyCoin(CoinEnv):\n    pass\n")
    mine = [f"imports=[{module}]", "env.type=my_coin"]
    # One step is all the comparison reads (the cosine schedule's first step has the full lr
    # whatever the run's length); the Ray run is killed in its step 2 and resumed to its end.
    local = load_config(None, [*COIN, *mine, f"model.path={model}", f"run_dir={tmp_path / 'local'}",
                               "trainer.max_checkpoints=3", "trainer.total_steps=1"])
    train(local, log=lambda m: None)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "coin.yaml").write_text("env:\n  type: coin\n  max_turns: 1\n")
    marker, run = tmp_path / "marker", tmp_path / "ray"
    marker.mkdir()
    args = ["--config-path", str(tmp_path / "cfg"), "--config-name", "coin", *COIN, *mine, f"model.path={model}",
            f"run_dir={run}", "runtime.kind=ray", "runtime.actor_train.world_size=2", "runtime.env_managers=2",
            f"env.args.marker={marker}", "env.args.kills={trainer_rank: 9}",  # the 9th training episode's step: 2
            "trainer.total_steps=2"]
    assert cli.main(["plan", *args, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert cli.main(["plan", *args]) == 0
    text = capsys.readouterr().out
    assert cli.main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert json.loads((run / "plan.json").read_text()) == shown and text in err
    assert shown["runtime"]["kind"] == "ray" and shown["warm_start"]["enabled"] is False
    assert Counter(w["role"] for w in shown["runtime"]["placement"]["workers"]) == {
        "actor_train": 2, "actor_infer": 1, "env_manager": 2}
    err = err.strip().splitlines()[-1]
    assert err.startswith("agentrl: error: trainer rank 1 died") and f"agentrl resume {run}" in err, err
    assert "the newest checkpoint is step 1" in err
    ours, theirs = _rows(run), _rows(tmp_path / "local")
    loss = [r["loss/policy"] for r in ours if r["step"] == 1 and "loss/policy" in r]
    want = [r["loss/policy"] for r in theirs if r["step"] == 1 and "loss/policy" in r]
    assert loss and want[0] != 0 and loss[0] == pytest.approx(want[0], rel=1e-5)
    diffs = _weight_diffs(run / "checkpoints" / "step_000001", tmp_path / "local" / "checkpoints" / "step_000001")
    print(f"world_size=2 vs one worker after step 1: loss {loss[0]!r} vs {want[0]!r}; max |dw| {max(diffs.values()):.3g}"
          f" (k_proj.bias, zero true gradient: {max(v for k, v in diffs.items() if 'k_proj.bias' in k):.3g}); "
          f"other weights {max(v for k, v in diffs.items() if 'k_proj.bias' not in k):.3g}")
    assert max(v for k, v in diffs.items() if "k_proj.bias" not in k) < 1e-5
    assert cli.main(["resume", str(run), "trainer.total_steps=3"]) == 0
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r] == [1, 2, 3]


def _weight_diffs(a, b):
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return {k: float((wa[k] - wb[k]).abs().max()) for k in wa}


# Over HTTP: 139 s on the loaded 2-core machine; the same faults, marked `slow` (the default suite runs it;
# `-m "not slow"` leaves it out).
@pytest.mark.parametrize("transport", ["ray", pytest.param("http", marks=pytest.mark.slow)])
def test_engines_and_env_managers_killed_mid_run_are_restarted_and_the_run_finishes(cluster, cache, tmp_path, transport):
    """Seed 003's AgentTrainer with an env class of its own, two env managers sharing one engine
    that needs a whole node (so it sits on the second one, and weights go by the object store):
    the engine is killed in step 1 and an env manager exits in step 2; Ray restarts both, the
    lost episodes count as failures and are replayed, and the run trains every step. Over HTTP
    the restarted engine serves on a new port, which the env managers learn from it."""
    model = _model(cache, LAKE)
    marker, logs = tmp_path / "marker", []
    marker.mkdir()
    cfg = load_config("configs/frozen_lake.yaml", [
        *LAKE, f"model.path={model}", f"run_dir={tmp_path / 'run'}", "runtime.kind=ray", "runtime.env_managers=2",
        "runtime.actor_infer.num_cpus=2", "rollout.batch_size=8", "actor.ppo_mini_batch_size=8",
        f"runtime.engine_transport={transport}",
        # Restarts are what is tested, not their timeout: on a loaded machine an engine's restart
        # (a new process that loads the model) took over the default 120 s.
        "runtime.restart_timeout=1800",
        f"env.args.marker={marker}", "env.args.kills={engine: 3, env_manager: 30}"])
    trainer = AgentTrainer(config=cfg, env_cls=ray_envs.SabotagedLake, log=logs.append)
    trainer.init_workers()
    summary = trainer.fit()
    assert summary["steps"] == 3
    assert any("weights by object_store" in m for m in logs), logs
    assert (marker / "killed_engine").exists() and (marker / "killed_env_manager").exists()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    total = lambda key: sum(r.get(key, 0) for r in rows)  # noqa: E731
    assert total("perf/ray_restarts_engine") == 1 and total("perf/ray_restarts_env_manager") == 1
    assert total("rollout/failures_worker") == 4  # the dead manager's share of its step: 2 groups of 2
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
    errors = read_jsonl(tmp_path / "run" / "errors.jsonl")
    assert {e["kind"] for e in errors} <= {"worker", "engine"}
    assert sum("env manager" in e["error"] and "died" in e["error"] for e in errors) == 4
    print(f"engine kill failed {total('rollout/failures_engine'):g} in-flight episodes; "
          f"env manager exit failed {total('rollout/failures_worker'):g}")


@pytest.mark.parametrize("overrides, message", [
    (["runtime.actor_infer.device_mapping=[0,1]"],
     "runtime.actor_infer.device_mapping=[0, 1] needs GPU 1, but the cluster has no GPU"),
    (["runtime.actor_train.world_size=8"], "the run needs 9 CPUs (actor_train 8 x 1 CPU, actor_infer 1 x 1 CPU"),
])
def test_an_impossible_placement_fails_in_one_line_before_any_actor(cluster, tmp_path, capsys, overrides, message):
    code = cli.main(["train", "configs/frozen_lake.yaml", "runtime.kind=ray", f"run_dir={tmp_path}", *overrides])
    err = without_plan(capsys.readouterr().err).strip().splitlines()  # a run logs its plan first
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not ray.util.list_named_actors() and not (tmp_path / "checkpoints").exists()


def test_a_placement_held_by_other_work_times_out_with_a_message(cluster, cache, tmp_path):
    """Another job holds a whole node: trainer rank 0 (pinned to the head) and a 2-CPU engine
    no longer fit, though the cluster could hold them; the wait ends at placement_timeout."""
    @ray.remote(num_cpus=2)
    class Hog:
        def ready(self):
            return True

    hog = Hog.remote()
    ray.get(hog.ready.remote())
    try:
        cfg = load_config(None, [*COIN, f"model.cache_dir={cache}", "runtime.kind=ray", "runtime.actor_infer.num_cpus=2",
                                 "runtime.placement_timeout=2", f"run_dir={tmp_path}"])
        with pytest.raises(ConfigError, match=r"did not place the run .* within runtime.placement_timeout=2s; "
                                              r"free now: \{'CPU': 2.0\}"):
            train(cfg, log=lambda m: None)
    finally:
        ray.kill(hog)
