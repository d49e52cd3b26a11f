"""Misbehaving envs through a run: each bad output fails its episode as an env error naming the
field (recorded in errors.jsonl); the run goes on below rollout.max_failed_fraction and stops
with one clear error above it, never a traceback nor a silent success."""

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.errors import EnvError, RolloutError
from agentrl.metrics import read_jsonl
from agentrl.runtime.envs import make_env_factories
from agentrl.models.embedded import cache_root, tiny_cache_key
from agentrl.runtime.local import train
from agentrl.runtime.warm import load_policy
from bad_envs import FAULTS  # tests/ is on sys.path (conftest.py); importing registers bad_lake

from test_train import TINY  # tests/e2e is on sys.path (pytest prepend mode)

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """A warm-started tiny model for FrozenLake, loaded by the runs below through model.path."""
    cache = tmp_path_factory.mktemp("model_cache")
    cfg = load_config(ROOT / "configs" / "frozen_lake.yaml", [*TINY, f"model.cache_dir={cache}"])
    load_policy(cfg, make_env_factories(cfg), log=lambda m: None)
    return cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"


def _cfg(run_dir, tiny_path, *extra):
    return load_config(ROOT / "configs" / "frozen_lake.yaml", [
        *TINY, f"model.path={tiny_path}", f"run_dir={run_dir}", "env.type=bad_lake", *extra])


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_env_that_always_breaks_its_contract_stops_the_run_naming_the_field(fault, tmp_path, tiny_path):
    with pytest.raises(RolloutError) as err:
        train(_cfg(tmp_path, tiny_path, f"env.args.fault={fault}"), log=lambda m: None)
    message = str(err.value)
    assert "\n" not in message and message.startswith("step 1: 4 of 4 episodes failed every attempt"), message
    assert f"first error: env: EnvError in {'reset' if 'reset' in fault else 'step'}: BadLake." in message
    assert FAULTS[fault][1] in message, message
    errors = [e for e in read_jsonl(tmp_path / "errors.jsonl") if e["step"] == 1]
    assert len(errors) == 8 and all(e["kind"] == "env" and FAULTS[fault][1] in e["error"] for e in errors)


def test_a_nan_reward_on_some_episodes_drops_their_groups_and_training_goes_on(tmp_path, tiny_path):
    cfg = _cfg(tmp_path, tiny_path, "env.args.fault=nan_reward", "env.args.every=2", "rollout.batch_size=8",
               "actor.ppo_mini_batch_size=8", "rollout.max_failed_fraction=1.0", "rollout.max_retries=0")
    summary = train(cfg, log=lambda m: None)
    assert summary["steps"] == 2
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "rollout/kept_groups" in r]
    assert sum(r["rollout/failures_env"] for r in rows) > 0
    assert sum(r["rollout/dropped_groups"] for r in rows) > 0
    trained = [r for r in rows if "loss/policy" in r]
    assert trained, "no step trained on the groups that were well formed"
    assert all(r["loss/policy"] == r["loss/policy"] for r in trained)  # no NaN reached the update
    errors = read_jsonl(tmp_path / "errors.jsonl")
    assert errors and all("BadLake.step() reward=nan; expected a finite number" in e["error"] for e in errors)


def test_a_first_observation_longer_than_the_context_is_an_error_not_an_empty_success(tmp_path, tiny_path):
    """A 1 MB first observation: no episode can take a turn; the run says so instead of exiting 0."""
    with pytest.raises(RolloutError, match=r"^evaluation: none of the 2 episodes generated a token "
                                           r"\(truncation_reason: context\)"):
        train(_cfg(tmp_path, tiny_path, "env.args.first_obs_chars=1000000"), log=lambda m: None)


def test_an_env_whose_close_raises_fails_at_the_start_up_check(tmp_path, tiny_path):
    with pytest.raises(EnvError, match=r"^env: env type 'bad_lake': close\(\) raised RuntimeError: the lake will not"):
        train(_cfg(tmp_path, tiny_path, "env.args.close_raises=true"), log=lambda m: None)
    res = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "env.type=bad_lake", "env.args.close_raises=true",
                          f"imports=[{ROOT / 'tests' / 'bad_envs.py'}]", f"run_dir={tmp_path / 'cli'}",
                          f"model.cache_dir={tmp_path / 'cache'}"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "close() raised RuntimeError" in lines[0], res.stderr[-2000:]
    assert not (tmp_path / "cache").exists()
