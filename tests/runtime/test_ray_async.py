"""Asynchronous rollout on Ray (rollout.max_staleness=1), end to end on test_ray_runtime's
two-node cluster: env-manager actors play groups ahead while rank 0 trains, weights reach the
engine replica between two batches of groups, the staleness bound holds for every trained id, a
killed run resumes by the local stream's rule, dead actors are restarted and their groups
replayed, and every value the local k=1 run logs is the Ray run's too (no id discarded, every
version known)."""

import re

import pytest

ray = pytest.importorskip("ray")

import ray_envs  # noqa: E402,F401  (registers coin and sabotaged_lake, for this process and the actors)
from agentrl import cli  # noqa: E402
from agentrl.config import load_config  # noqa: E402
from agentrl.dumps import dump_path, read_dump  # noqa: E402
from agentrl.metrics import read_jsonl  # noqa: E402
from agentrl.runtime.local import train  # noqa: E402
from test_ray_runtime import COIN, LAKE, _model, _rows, cache, cluster  # noqa: E402,F401  (the shared fixtures)

pytestmark = pytest.mark.ray

ASYNC = ["rollout.max_staleness=1", "trainer.dump_trajectories_freq=1"]


def _dumps(run_dir, steps):
    return {s: read_dump(dump_path(run_dir, s)) for s in steps}


def _within_bound(dumps, k=1):
    """Every trained id came from a policy at most k versions older than the one trained."""
    return all(v >= d["policy_version"] - k for d in dumps.values() for e in d["episodes"] for v in e["ver"])


def test_an_async_ray_run_trains_within_the_bound_and_logs_the_local_runs_values(cluster, cache, tmp_path):
    """configs/frozen_lake.yaml, k=1, 3 steps (evaluations at steps 2 and 3, a checkpoint after
    each), one engine replica and one env manager: the Ray run trains every step on the step's
    groups with the decoupled loss, no id older than step - 1, and logs every value the local
    k=1 run logs (perf/ clocks and the Ray run's ray/ counts aside); a second Ray run logs them
    again. The schedule (which groups each step trains, the engine batches they were played in,
    when weights land) is a function of the config and seed, not of how fast the actors run."""
    overrides = [*LAKE, "model.warm_start.max_steps=60", "rollout.batch_size=8", "rollout.group_size=4", *ASYNC,
                 "trainer.total_steps=3", f"model.cache_dir={cache}"]
    for run in ("local", "ray", "ray_again"):
        cfg = load_config("configs/frozen_lake.yaml", [*overrides, f"run_dir={tmp_path / run}",
                                                       f"runtime.kind={run.split('_')[0]}"])
        assert train(cfg, log=lambda m: None)["steps"] == 3
    local, remote, again = (_rows(tmp_path / run) for run in ("local", "ray", "ray_again"))
    steps = [r for r in remote if "rollout/kept_groups" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["rollout/staleness_max"] <= 1 and r["rollout/kept_groups"] == 2 for r in steps)
    assert max(r["rollout/staleness_max"] for r in steps) == 1  # rollout ran ahead of training
    assert all("policy/is_weight_mean" in r for r in steps)  # the decoupled loss corrected the stale ids
    # no filter, no failure: every id decoded reaches the loss, each with its version (issue 44)
    for r in steps:
        assert r["rollout/discarded_tokens"] == 0.0 and r["rollout/version_coverage"] == 1.0, r
        assert all(r[f"rollout/discarded_tokens/{c}"] == 0.0 for c in ("filtered", "stale", "failed", "aborted")), r
    dumps = _dumps(tmp_path / "ray", [1, 2, 3])
    assert [d["policy_version"] for d in dumps.values()] == [0, 1, 2] and _within_bound(dumps)
    trained = [e["group"] for d in dumps.values() for e in d["episodes"]]
    assert len(set(trained)) * 4 == len(trained) == 24  # six groups, none trained twice
    differ = [(theirs["step"], k) for mine, theirs in zip(remote, local) for k in mine.keys() | theirs.keys()
              if mine.get(k) != theirs.get(k)]
    assert len(remote) == len(local) and not differ, f"{len(differ)} values differ: {sorted(differ)[:12]}"
    assert again == remote
    local_dumps = _dumps(tmp_path / "local", [1, 2, 3])
    assert [[e["ids"] for e in d["episodes"]] for d in dumps.values()] == \
        [[e["ids"] for e in d["episodes"]] for d in local_dumps.values()]


def test_a_killed_async_ray_run_resumes_by_the_local_streams_rule(cluster, cache, tmp_path, capsys):
    """k=1 with two trainer ranks; rank 1 killed once groups of policy version 2 play: the run
    stops with one line naming its newest checkpoint, and `agentrl resume` trains the remaining
    steps on groups none of which the checkpointed steps had trained (consumed groups are skipped,
    the rest are played again by the restored policy), every id within the bound."""
    run, marker = tmp_path / "run", tmp_path / "marker"
    marker.mkdir()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "coin.yaml").write_text("env:\n  type: coin\n  max_turns: 1\n")
    # COIN: 2 groups of 4 one-turn episodes a step, so the 24 episodes of groups 0-5 start by
    # version 1 and the 25th env step is played at version 2 or later: after step 1's checkpoint.
    args = ["train", "--config-path", str(tmp_path / "cfg"), "--config-name", "coin", *COIN, *ASYNC,
            f"model.path={_model(cache, COIN)}", f"run_dir={run}", "runtime.kind=ray",
            "runtime.actor_train.world_size=2", "trainer.total_steps=5", "trainer.max_checkpoints=5",
            f"env.args.marker={marker}", "env.args.kills={trainer_rank: 25}"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("agentrl: error: trainer rank 1 died") and f"agentrl resume {run}" in err, err
    saved = int(re.search(r"the newest checkpoint is step (\d+)", err).group(1))
    assert 1 <= saved < 5
    before = {e["group"] for d in _dumps(run, range(1, saved + 1)).values() for e in d["episodes"]}
    assert cli.main(["resume", str(run)]) == 0
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "rollout/kept_groups" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["rollout/staleness_max"] <= 1 for r in rows)
    dumps = _dumps(run, range(1, 6))
    after = [e["group"] for s, d in dumps.items() if s > saved for e in d["episodes"]]
    assert after and not before & set(after) and _within_bound(dumps)
    print(f"killed after checkpoint {saved}; resumed steps trained groups {sorted(set(after))}, "
          f"checkpointed ones {sorted(before)}")


def test_an_async_ray_run_whose_engine_and_env_manager_die_finishes_every_step(cluster, cache, tmp_path):
    """k=1, two env managers sharing one engine: the engine is killed at the 3rd training env step
    and an env manager exits at the 30th, while groups play ahead; Ray restarts both, the restarted
    engine gets the current weights before it serves, the dead manager's groups are played again
    as their next attempt, and every step trains within the bound."""
    marker = tmp_path / "marker"
    marker.mkdir()
    cfg = load_config("configs/frozen_lake.yaml", [
        *LAKE, *ASYNC, f"model.path={_model(cache, LAKE)}", f"run_dir={tmp_path / 'run'}", "runtime.kind=ray",
        "runtime.env_managers=2", "rollout.batch_size=8", "actor.ppo_mini_batch_size=8", "env.type=sabotaged_lake",
        "runtime.restart_timeout=1800",  # restarts are tested, not their timeout (a loaded machine is slow)
        f"env.args.marker={marker}", "env.args.kills={engine: 3, env_manager: 30}"])
    assert train(cfg, log=lambda m: None)["steps"] == 3
    assert (marker / "killed_engine").exists() and (marker / "killed_env_manager").exists()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    total = lambda key: sum(r.get(key, 0) for r in rows)  # noqa: E731
    assert total("perf/ray_restarts_engine") == 1 and total("perf/ray_restarts_env_manager") == 1
    assert total("rollout/failures_worker") >= 1
    steps = [r for r in rows if "rollout/kept_groups" in r]
    assert [r["step"] for r in steps] == [1, 2, 3] and all(r["rollout/staleness_max"] <= 1 for r in steps)
    assert _within_bound(_dumps(tmp_path / "run", [1, 2, 3]))
    errors = read_jsonl(tmp_path / "run" / "errors.jsonl")
    assert {e["kind"] for e in errors} <= {"worker", "engine"}
    print(f"k=1: engine kill failed {total('rollout/failures_engine'):g} episodes, env manager exit "
          f"{total('rollout/failures_worker'):g}")
