"""Each feature of a local run, on the Ray runtime (issue 31's matrix): LoRA, OpenAI-client agents,
and the matrix of history window, critic, GiGPO, curriculum and the tool agent, each against the
local run of the same config, on the two-node cluster of test_ray_runtime.py's `cluster` (a module
of its own, so that the suite's two workers share the Ray tests)."""

import shutil

import pytest

ray = pytest.importorskip("ray")

import ray_envs  # noqa: E402,F401  (registers coin and sabotaged_lake, for this process and the actors)
from agentrl import cli  # noqa: E402
from agentrl.api import fit  # noqa: E402
from agentrl.config import load_config  # noqa: E402
from agentrl.metrics import read_jsonl  # noqa: E402
from agentrl.runtime.local import train  # noqa: E402
from helpers import bwrap_problem  # noqa: E402
from test_ray_runtime import (COIN, ENGINE_LOGPROB_KEYS, LAKE, PPO, TINY, _model, _rows,  # noqa: E402,F401
                              cache, cluster)

pytestmark = pytest.mark.ray


def _differ(run_a, run_b, skip=()):
    """(step, key) of every logged value (perf/ aside) that differs between two runs."""
    a, b = _rows(run_a), _rows(run_b)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    same = lambda x, y: x == y or (x != x and y != y)  # noqa: E731  (NaN, as JSON gives it, equals NaN)
    return [(mine["step"], k) for mine, theirs in zip(a, b) for k in sorted(mine.keys() | theirs.keys())
            if k not in skip and not same(mine.get(k), theirs.get(k))]


def test_lora_with_a_critic_and_a_kl_reference_trains_on_ray_as_locally_and_only_the_adapter_travels(
        cluster, cache, tmp_path):
    """configs/frozen_lake_lora.yaml with PPO (a critic and a KL loss to the reference) on each
    runtime, 2 steps then `agentrl resume` to 3 (from the adapter checkpoint): every non-perf metric
    is the local run's, and each weight sync moves exactly the adapter the checkpoint holds, not the
    model. The critic actor's body keeps the policy's adapters (its own to train) and the reference
    actor is the starting model, as the local run's policy with its adapters off."""
    overrides = [*LAKE, "model.warm_start.max_steps=60", "rollout.batch_size=8", "rollout.group_size=4", *PPO,
                 f"model.cache_dir={cache}", "trainer.total_steps=2"]
    for kind in ("local", "ray"):
        fit("configs/frozen_lake_lora.yaml",
            overrides=[*overrides, f"run_dir={tmp_path / kind}", f"runtime.kind={kind}"], log=lambda m: None)
        assert cli.main(["resume", str(tmp_path / kind), "trainer.total_steps=3"]) == 0
    assert _differ(tmp_path / "ray", tmp_path / "local") == []
    local = _rows(tmp_path / "local")
    assert any(r.get("loss/policy") for r in local)
    assert any(r.get("loss/kl") for r in local[2:]) and any(r.get("loss/value") for r in local)
    from safetensors.torch import load_file

    ckpt = tmp_path / "ray" / "checkpoints" / "step_000003"
    assert not (ckpt / "model.safetensors").exists()
    adapter = sum(t.numel() * t.element_size() for t in load_file(str(ckpt / "adapter_model.safetensors")).values())
    synced = [r["perf/weight_sync_mb"] * 2**20 for r in read_jsonl(tmp_path / "ray" / "metrics.jsonl")
              if "perf/weight_sync_mb" in r]
    print(f"weight sync per step (bytes): {synced}; adapter {adapter}")
    assert synced and all(round(b) % adapter == 0 and b > 0 for b in synced), (synced, adapter)


def test_lora_on_two_trainer_ranks_updates_as_one(cluster, cache, tmp_path):
    """model.lora.rank=8 with actor_train.world_size=2: step 1's loss and adapter weights equal one
    worker's."""
    model = _model(cache, COIN)
    runs = {}
    for ranks in (1, 2):
        runs[ranks] = tmp_path / f"ranks{ranks}"
        fit(None, overrides=[*COIN, f"model.path={model}", "model.lora.rank=8", "actor.lr=5e-3",
                             "trainer.total_steps=1", f"run_dir={runs[ranks]}", "runtime.kind=ray",
                             f"runtime.actor_train.world_size={ranks}"], log=lambda m: None)
    from safetensors.torch import load_file

    one, two = [load_file(str(runs[r] / "checkpoints" / "step_000001" / "adapter_model.safetensors")) for r in (1, 2)]
    assert one.keys() == two.keys()
    print(f"LoRA world_size=2 vs 1 after step 1: max |dw| {max(float((one[k] - two[k]).abs().max()) for k in one):.3g}")
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 1e-5
    assert any(float(one[k].abs().max()) > 0 for k in one if "lora_B" in k), "the adapters trained"
    loss = [[r["loss/policy"] for r in _rows(runs[r]) if "loss/policy" in r] for r in (1, 2)]
    assert loss[0] and loss[0][0] != 0 and loss[1][0] == pytest.approx(loss[0][0], rel=1e-5)


@pytest.mark.parametrize("transport, by_imports", [("ray", False), ("http", True)], ids=["ray-path", "http-imports"])
def test_an_openai_client_agent_trains_on_ray_as_locally(cluster, cache, tmp_path, transport, by_imports):
    """examples/openai_frozen_lake.py's `run(client, env, task)` played by the env managers, its
    sessions generating on the engine replica (by Ray calls, or over HTTP), the entry named by its
    .py path or as a module of `imports`: every non-perf metric equals the local run's."""
    entry, imports = "examples/openai_frozen_lake:run", []
    if by_imports:
        folder = tmp_path / "agents"
        folder.mkdir()
        shutil.copy("examples/openai_frozen_lake.py", folder / "ray_openai_lake.py")
        entry, imports = "ray_openai_lake:run", [f"imports=[{folder / 'ray_openai_lake.py'}]"]
    overrides = [*LAKE, "model.warm_start.max_steps=60", "rollout.batch_size=8", "rollout.group_size=4",
                 f"model.cache_dir={cache}", "agent.type=openai", f"agent.args.entry={entry}", *imports]
    for kind in ("local", "ray"):
        fit("configs/frozen_lake.yaml", overrides=[*overrides, f"run_dir={tmp_path / kind}", f"runtime.kind={kind}",
                                                   *([f"runtime.engine_transport={transport}"] * (kind == "ray"))],
            log=lambda m: None)
    rows = _rows(tmp_path / "ray")
    assert all(r["rollout/episodes"] == 8 and r["rollout/errors"] == 0 and r["rollout/response_tokens"] > 0
               for r in rows if "rollout/episodes" in r)
    assert any(r.get("loss/policy") for r in rows)
    # The engine's own logprobs are not deterministic even between two local runs: a session's
    # request reaches the engine over loopback HTTP, so which requests share a batch depends on
    # arrival (measured: policy/logprob_diff_mean 2.10e-7 vs 2.02e-7 at one step of two local
    # runs). Sampled ids cannot differ (each request's seed is its task's and turn's).
    assert _differ(tmp_path / "ray", tmp_path / "local", skip=ENGINE_LOGPROB_KEYS) == []
    local = _rows(tmp_path / "local")
    for mine, theirs in zip(rows, local):
        print({k: (mine[k], theirs[k]) for k in ENGINE_LOGPROB_KEYS if k in mine and mine[k] != theirs[k]})
        assert all(mine[k] == pytest.approx(theirs[k], abs=1e-6) for k in ENGINE_LOGPROB_KEYS if k in mine)


# The feature matrix (issue 31): each feature a user moves from `local` to `ray` keeps its numbers.
# An entry is the config and the overrides that turn the feature on; both runtimes run them on the
# model the local run warm-started (FrozenLake: rewards differ within a group), 2 steps, and every
# metric but the perf/ and ray/ ones is equal. `mark`: a metric only the feature logs, nonzero.
FEATURES = {
    "history_window": ("configs/frozen_lake.yaml", ["agent.args.history_length=1"], "rollout/segments"),
    "critic": ("configs/frozen_lake.yaml", PPO, "loss/value"),
    "gigpo": ("configs/frozen_lake.yaml", ["algorithm.adv_estimator=gigpo"], None),  # logs nothing of its own
    # rank 0 draws each step's tasks from the estimates the env managers' episodes updated
    "curriculum": ("configs/frozen_lake.yaml", ["rollout.curriculum.enable=true", "rollout.curriculum.pool_size=4"],
                   "curriculum/unseen_tasks"),
    # the tool agent with the sandboxed python tool, run by the env managers (bubblewrap in their processes)
    # (a model that has learnt the call's form: the shape and warm start of tests/e2e/test_tool_train.py,
    # on 8 played batches of demonstrations in turn: the config's demo_pool of 100 runs the sandbox 800 times)
    "tool_agent": ("configs/tool_python.yaml", [
        "env.max_turns=1", "env.args.min_operand=2", "env.args.max_operand=9", "model.tiny.hidden_size=64",
        "model.tiny.num_hidden_layers=2", "model.tiny.intermediate_size=128", "model.tiny.vocab_size=400",
        "model.warm_start.max_steps=100", "model.warm_start.batch_size=8", "model.warm_start.lr=3e-3",
        "model.warm_start.demo_pool=8", "rollout.temperature=0.3",
        "agent.args.tool_args.python.timeout=20", "rollout.max_new_tokens=48"],
                   "env/products/tools/calls"),
    # a game in self-play (agents/game.py): one trajectory per seat, RAE's running baselines per seat
    # on the trainer, the random opponent of evaluation (a barely warm-started model: short games)
    "selfplay": ("configs/tictactoe_selfplay.yaml", ["model.warm_start.max_steps=2", "model.warm_start.batch_size=4",
                                                     "trainer.test_freq=2", "trainer.eval_episodes=4"],
                 "reward/rae_baseline/textarena/player_0"),
}
# The features run together, one pair of runs (local, ray) for each set: features of separate parts
# (the agent's prompt, the advantage, the task draw) share one pair, and every feature of a pair is
# checked as if it ran alone (its mark; no value differs). The critic is an advantage estimator as
# GiGPO is, and the tool agent has a config of its own: each their own pair.
PAIRS = [("history_window", "gigpo", "curriculum"), ("critic",), ("tool_agent",), ("selfplay",)]
assert sorted(f for pair in PAIRS for f in pair) == sorted(FEATURES), "every feature runs, once"


@pytest.mark.parametrize("features", PAIRS, ids=["+".join(pair) for pair in PAIRS])
def test_each_feature_logs_the_local_metrics_on_ray(cluster, cache, tmp_path, features):
    """The features on, `local` then `ray` (one engine replica, one env manager, two nodes): every
    logged value but the perf/ and ray/ ones is identical, and each feature left its mark."""
    (config,) = {FEATURES[f][0] for f in features}  # a pair shares its config
    overrides = [o for f in features for o in FEATURES[f][1]]
    if "tool_agent" in features and bwrap_problem() is not None:
        pytest.skip(f"bubblewrap cannot run here: {bwrap_problem()}")
    for kind in ("local", "ray"):
        cfg = load_config(config, [
            *TINY, *(LAKE[len(TINY):] if config.endswith("frozen_lake.yaml") else []), "model.warm_start.max_steps=60", "rollout.batch_size=8", "rollout.group_size=4",
            "actor.ppo_mini_batch_size=8", "trainer.total_steps=2", "trainer.test_freq=0", *overrides,
            f"model.cache_dir={cache}", f"run_dir={tmp_path / kind}", f"runtime.kind={kind}"])
        train(cfg, log=lambda m: None)
    local, remote = _rows(tmp_path / "local"), _rows(tmp_path / "ray")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("ray/")} for r in rows]  # noqa: E731
    # The tool agent's calls run in processes of their own and end when they end, so the engine's
    # batches (not its seeded samples) depend on timing: its logprobs can differ in the last float bits.
    loose = ENGINE_LOGPROB_KEYS if "tool_agent" in features else ()
    differ = [(theirs["step"], k) for mine, theirs in zip(strip(remote), strip(local))
              for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)
              and not (k in loose and mine.get(k) == pytest.approx(theirs.get(k), abs=1e-4))]
    assert [r["step"] for r in remote] == [r["step"] for r in local] == [0, 1, 2, 2] and differ == []
    for feature in features:
        mark = FEATURES[feature][2]
        assert mark is None or any(r.get(mark) for r in local), (feature, sorted(local[1]))
