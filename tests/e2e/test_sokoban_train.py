"""End-to-end: configs/sokoban.yaml trains the embedded model and logs Sokoban's own metrics."""

import json

from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

TINY = [
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=3", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "env.max_turns=3", "env.args.max_steps=3", "trainer.total_steps=2", "trainer.test_freq=1",
    "trainer.eval_episodes=4", "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]",
]


def test_sokoban_config_trains_and_reports_success_against_the_optimum(tmp_path):
    cfg = load_config("configs/sokoban.yaml", [*TINY, f"run_dir={tmp_path / 'run'}",
                                               f"model.cache_dir={tmp_path / 'cache'}"])
    summary = train(cfg, log=lambda m: None)
    assert summary["eval_optimum"] == 1.0  # every generated room is solvable within max_steps
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    evals = [r for r in rows if "eval/success" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    for r in evals:
        # eval/sokoban/steps is over episodes that reached the env's end (all of them: max_turns = max_steps)
        assert 1.0 <= r["eval/sokoban/optimal_moves"] <= 3.0 and r["eval/sokoban/steps"] <= 3.0
        assert 0.0 <= r["eval/sokoban/boxes_on_target"] <= 1.0 and r["eval/sokoban/optimal_pushes"] >= 1.0
        assert ("eval/sokoban/steps_over_optimal" in r) == (r["eval/success"] > 0)
        assert 0.0 <= r["eval/baseline_room_blind"] <= 1.0  # the best room-blind move sequence
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 2 and all("env/sokoban/optimal_moves" in r and "env/sokoban/steps" in r for r in steps)
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert "Sokoban" in sample["text"] and "# # # # # #" in sample["text"]
