"""A run with a curriculum (rollout.curriculum) logs curriculum/* every step, plays its draws from
the pool, and a run killed mid-step and resumed continues them exactly (the same metrics, rows of
curriculum/* included, and weights as a run never stopped)."""

import signal

import pytest
import torch

from agentrl.cli import main as cli_main
from agentrl.metrics import read_jsonl
from agentrl.train.checkpoint import latest_checkpoint, load_state

from test_resume import KILLER, _rows, _run, _weights  # tests/e2e is on sys.path (pytest prepend mode)
from test_train import TINY

STEPS = 4
POOL = 3  # two groups a step from three tasks: tasks come back, and their estimates steer the draws


def _args(run, cache) -> list[str]:
    return ["configs/frozen_lake_random.yaml", *TINY, f"run_dir={run}", f"model.cache_dir={cache}",
            f"trainer.total_steps={STEPS}", "trainer.save_freq=1", "trainer.max_checkpoints=3",
            "rollout.curriculum.enable=true", f"rollout.curriculum.pool_size={POOL}",
            "rollout.curriculum.uniform_ratio=0.5"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, run_model_cache):
    """The run never stopped: `agentrl train` through the CLI's entry point, in this process (only
    the killed run below needs a process of its own)."""
    cache = run_model_cache  # the test run's: its warm start is shared with other modules
    run = tmp_path_factory.mktemp("straight")
    assert cli_main(["train", *_args(run, cache)]) == 0
    return run, cache


def test_a_curriculum_run_logs_curriculum_stats_and_plays_pool_tasks(straight):
    run, _ = straight
    steps = [r for r in read_jsonl(run / "metrics.jsonl") if "rollout/episodes" in r]
    assert len(steps) == STEPS
    for r in steps:
        assert 0.0 <= r["curriculum/pool_draws"] <= 1.0
        assert r["curriculum/unseen_tasks"] + r["curriculum/easy_tasks"] + r["curriculum/hard_tasks"] \
            + r["curriculum/informative_tasks"] <= POOL
    assert steps[0]["curriculum/unseen_tasks"] < POOL  # the first step's groups were seen
    state = load_state(latest_checkpoint(run / "checkpoints"))["curriculum"]
    played = sum(n for _, n in state["estimates"]["frozen_lake"].values())
    assert played == 2 * STEPS and set(state["estimates"]["frozen_lake"]) <= set(range(POOL))


def test_a_killed_curriculum_run_resumes_its_draws_exactly(tmp_path, straight, capsys):
    ref, cache = straight
    run = tmp_path / "run"
    res = _run("-c", KILLER, "update", "3", "train", *_args(run, cache))
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert load_state(latest_checkpoint(run / "checkpoints"))["step"] == 2
    # `agentrl resume` in this process (tests/e2e/test_resume.py resumes in a process of its own)
    code = cli_main(["resume", str(run)])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert _rows(run) == _rows(ref)
    mine, theirs = _weights(run), _weights(ref)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert load_state(latest_checkpoint(run / "checkpoints"))["curriculum"] == \
        load_state(latest_checkpoint(ref / "checkpoints"))["curriculum"]
