"""End-to-end: configs/tictactoe_selfplay.yaml trains the embedded model 3 steps of self-play on
TextArena's Tic Tac Toe: both seats of every game train, each seat's ids are the engine's, RAE keeps
a baseline per seat, and evaluation plays each seat against the random legal player."""

import shutil

import pytest

from agentrl.cli import main as cli_main
from agentrl.config import load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

pytest.importorskip("textarena", reason="TextArena is not installed (pip install 'agentrl[textarena]')")

TINY = [  # tests/e2e/test_textarena_train.py's tiny run, 3 steps, a trajectory dump at each
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=2", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "trainer.total_steps=3", "trainer.test_freq=3", "trainer.eval_episodes=4", "trainer.save_freq=1",
    "trainer.max_checkpoints=3",
    "trainer.progress=false", "trainer.logger=[jsonl]", "trainer.dump_trajectories_freq=1",
]
ROLES = ("player_0", "player_1")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("selfplay")
    cfg = load_config("configs/tictactoe_selfplay.yaml", [*TINY, f"run_dir={tmp / 'run'}",
                                                          f"model.cache_dir={tmp / 'cache'}"])
    train(cfg, log=lambda m: None)
    return tmp / "run"


def test_both_seats_train_on_the_engines_ids(run):
    dumps = [read_dump(path) for _, path in list_dumps(run)]
    assert len(dumps) == 3
    for dump in dumps:
        eps = dump["episodes"]
        # Self-play: every seat of a game that acted trains (the first always acts; the barely
        # warm-started model may lose on two invalid moves before the second's turn).
        assert {ep["role"] for ep in eps} <= set(ROLES)
        for group in {ep["group"] for ep in eps}:
            seats = [ep["role"] for ep in eps if ep["group"] == group]
            assert seats.count("player_0") >= seats.count("player_1") and "player_0" in seats
        for ep in eps:
            generated = [k for k, m in enumerate(ep["mask"]) if int(m)]
            assert generated and len(ep["lp"]) == len(ep["old"]) == len(generated)
            assert all(abs(a - b) < 1e-3 for a, b in zip(ep["lp"], ep["old"]))  # scored as the engine sampled it
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert "reward/rae_baseline/textarena/player_0" in r  # RAE's running baseline of the seat
        assert r["policy/logprob_diff_max/player_0"] < 1e-3  # the seat's ids, scored as its engine sampled them
        for role in ROLES:  # a finished game is a win, a draw or a loss for each seat
            if f"env/textarena/role/{role}/win" in r:
                outcome = sum(r[f"env/textarena/role/{role}/{k}"] for k in ("win", "draw", "loss"))
                assert outcome == pytest.approx(1.0)


def test_evaluation_plays_each_seat_against_the_random_player(run):
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if "eval/success" in r]
    assert [r["step"] for r in evals] == [0, 3]
    for r in evals:
        for role in ROLES:
            assert r[f"eval/textarena/role/{role}/episodes"] == 2.0  # 4 eval games, half in each seat
            assert 0.0 <= r[f"eval/baseline_random_win_{role}"] <= 1.0 and 0.0 <= r[f"eval/baseline_demo_win_{role}"] <= 1.0
    assert len({r["eval/baseline_random_win_player_0"] for r in evals}) == 1  # the same games every time


def test_a_resume_replays_the_last_step_exactly(run, tmp_path, capsys):
    """Step 3 replayed from step 2's checkpoint logs what the straight run logged: RAE's running
    baselines and the seats' games come back with the checkpoint."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "step_000003")
    assert cli_main(["resume", str(copy)]) == 0, capsys.readouterr().err[-2000:]

    def rows(folder):
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_jsonl(folder / "metrics.jsonl")]

    assert rows(copy) == rows(run)
