"""Misbehaving envs and agents through a run: each bad output, exit or hang fails its episode as
an env, agent or timeout error naming what went wrong (recorded in errors.jsonl); the run goes on
below rollout.max_failed_fraction and stops with one clear error above it (or when every episode
of a step failed), never a traceback, an exit of the user's choosing, a hang nor a silent success.
The warm start's demonstrations and random play are guarded the same way."""

import contextlib
import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.errors import EnvError, RolloutError
from agentrl.metrics import read_jsonl
from agentrl.models.embedded import cache_root, tiny_cache_key
from agentrl.runtime.assembly.policy import load_policy
from agentrl.runtime.local import train
from agentrl.runtime.assembly.plan import plan
from bad_agents import FAULTS as AGENT_FAULTS  # importing registers bad_agent
from bad_envs import ESCAPES, FAULTS  # tests/ is on sys.path (conftest.py); importing registers bad_lake

from test_train import TINY  # tests/e2e is on sys.path (pytest prepend mode)

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def tiny_path(run_model_cache):
    """A warm-started tiny model for FrozenLake, loaded by the runs below through model.path."""
    cfg = load_config(ROOT / "configs" / "frozen_lake.yaml", [*TINY, f"model.cache_dir={run_model_cache}"])
    load_policy(plan(cfg), log=lambda m: None)  # the test run's cache: other modules share it
    return cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"


def _cfg(run_dir, tiny_path, *extra):
    return load_config(ROOT / "configs" / "frozen_lake.yaml", [
        *TINY, f"model.path={tiny_path}", f"run_dir={run_dir}", "env.type=bad_lake", *extra])


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_env_that_always_breaks_its_contract_stops_the_run_naming_the_field(fault, tmp_path, tiny_path):
    with pytest.raises(RolloutError) as err:
        train(_cfg(tmp_path, tiny_path, f"env.args.fault={fault}"), log=lambda m: None)
    message = str(err.value)
    # The evaluation before training comes first: none of its episodes is left to score.
    assert "\n" not in message and message.startswith("evaluation: 2 of 2 episodes failed every attempt "
                                                      "(every one of them)"), message
    assert f"first error: env: EnvError in {'reset' if 'reset' in fault else 'step'}: BadLake." in message
    assert FAULTS[fault][1] in message, message
    errors = [e for e in read_jsonl(tmp_path / "errors.jsonl") if e["step"] == 0]
    assert len(errors) == 4 and all(e["kind"] == "env" and FAULTS[fault][1] in e["error"] for e in errors)


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


@pytest.mark.parametrize("fault", sorted(ESCAPES))
def test_an_env_that_exits_or_raises_a_base_exception_stops_the_run_in_one_line(fault, tmp_path, tiny_path):
    """SystemExit, KeyboardInterrupt or another BaseException from step: an env failure, not an exit."""
    with pytest.raises(RolloutError) as err:
        train(_cfg(tmp_path, tiny_path, f"env.args.fault={fault}"), log=lambda m: None)
    message = str(err.value)
    assert "\n" not in message and message.startswith("evaluation: 2 of 2 episodes failed every attempt"), message
    assert f"first error: env: {ESCAPES[fault][1]}" in message, message


def test_an_env_that_exits_on_some_episodes_drops_their_groups_and_training_goes_on(tmp_path, tiny_path):
    cfg = _cfg(tmp_path, tiny_path, "env.args.fault=sys_exit", "env.args.every=2", "rollout.batch_size=8",
               "actor.ppo_mini_batch_size=8", "rollout.max_failed_fraction=1.0", "trainer.eval_episodes=8")
    summary = train(cfg, log=lambda m: None)
    assert summary["steps"] == 2
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "rollout/kept_groups" in r]
    assert sum(r["rollout/failures_env"] for r in rows) > 0 and any("loss/policy" in r for r in rows)
    assert all("SystemExit in step: 3" in e["error"] for e in read_jsonl(tmp_path / "errors.jsonl"))


@pytest.mark.parametrize("fault", sorted(AGENT_FAULTS))
def test_an_agent_returning_what_cannot_be_trained_on_stops_the_run_in_one_line(fault, tmp_path, tiny_path):
    """Ids outside the vocabulary, NaN logprobs, stale or made-up versions, wrong objects, an empty
    list, sys.exit: each fails its episode as an agent error naming it (every training episode
    here, so the step stops the run); the evaluation before training is left alone."""
    cfg = _cfg(tmp_path, tiny_path, "env.type=frozen_lake", "agent.type=bad_agent", f"agent.args.fault={fault}")
    with pytest.raises(RolloutError) as err:
        train(cfg, log=lambda m: None)
    message = str(err.value)
    step = 2 if fault == "stale_version" else 1
    assert "\n" not in message and message.startswith(f"step {step}: 4 of 4 episodes failed every attempt"), message
    assert "first error: agent: " in message and AGENT_FAULTS[fault] in message, message
    errors = [e for e in read_jsonl(tmp_path / "errors.jsonl") if e["step"] == step]
    assert len(errors) == 8 and all(e["kind"] == "agent" and AGENT_FAULTS[fault] in e["error"] for e in errors)


# ---------------------------------------------------------------------------- the warm start, by the CLI
def _cli(tmp_path, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", *TINY, f"run_dir={tmp_path / 'run'}",
                           f"model.cache_dir={tmp_path / 'cache'}", f"imports=[{ROOT / 'tests' / 'bad_envs.py'}]",
                           "env.type=bad_lake", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def _main(tmp_path, *args):
    """`_cli`'s command through the CLI's entry point in this process (bad_lake is registered
    here by the import above): its exit code and output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", *TINY, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}",
                     "env.type=bad_lake", *args])
    return subprocess.CompletedProcess(["agentrl", "train", *args], code, out.getvalue(), err.getvalue())


def _last_line(res, code=2):
    assert res.returncode == code, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return res.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("fault, phase, words", [
    ("sys_exit", "demo", "warm start step 1: demonstrations: 4 of 4 episodes failed every attempt"),
    ("async_hang", "demo", "warm start step 1: demonstrations: 4 of 4 episodes failed every attempt"),
    ("sys_exit", "all", "tag bad_lake: random play for the tokenizer's corpus: 200 of 200 episodes failed"),
    ("sync_block", "all", "the episodes' event loop has not run for"),
])
def test_the_warm_start_plays_user_envs_guarded_as_training_does(tmp_path, fault, phase, words):
    """Demonstrations and the tokenizer's random play: an env that exits or hangs (past
    rollout.episode_timeout) is a counted failure, and a warm start none of whose episodes can be
    played stops in one line, never a traceback, an exit 3 or a hang."""
    args = (f"env.args.fault={fault}", f"env.args.phase={phase}", "rollout.episode_timeout=10")
    # An env that exits, by the CLI's entry point here (an exit escaping it would end this test);
    # one that hangs, in a process of its own (its blocked thread must not outlive the test).
    line = _last_line(_main(tmp_path, *args) if fault == "sys_exit" else _cli(tmp_path, *args))
    assert line.startswith("agentrl: error: ") and words in line, line
    if fault == "sys_exit":
        assert "SystemExit in step: 3" in line


def test_ctrl_c_stops_a_warm_start_whose_env_blocks_without_a_timeout(tmp_path):
    """An env that blocks its thread in the tokenizer's random play (rollout.episode_timeout=null):
    the first Ctrl-C, sent once the env blocks, stops the run in one line."""
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "train", *TINY, f"run_dir={tmp_path / 'run'}",
                             f"model.cache_dir={tmp_path / 'cache'}", f"imports=[{ROOT / 'tests' / 'bad_envs.py'}]",
                             "env.type=bad_lake", "env.args.fault=sync_block", "rollout.episode_timeout=null"],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        seen = []
        while not seen or seen[-1] != "bad_lake: blocking":
            line = proc.stderr.readline()
            assert line, f"the run ended before the env blocked: {seen}"
            seen.append(line.rstrip("\n"))
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=300)[1]
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, rest[-3000:]
    assert rest.strip().splitlines() == [f"agentrl: interrupted; resume with `agentrl resume {tmp_path / 'run'}`"]


def test_an_openai_agent_entry_module_that_exits_is_one_line(tmp_path):
    module = tmp_path / "leaves.py"
    module.write_text("import sys\nsys.exit(4)\n")
    res = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", *TINY, f"run_dir={tmp_path / 'run'}",
                          f"model.cache_dir={tmp_path / 'cache'}", "agent.type=openai",
                          f"agent.args.entry={module}:run"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    line = _last_line(res)
    assert res.stderr.strip().count("\n") == 0, res.stderr
    assert f"module '{module}' called sys.exit(4) while being imported" in line, line
