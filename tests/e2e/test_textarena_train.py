"""End-to-end: configs/textarena.yaml trains the embedded model 3 steps on TextArena's Guess the Number,
logs its references, and trains the engine's ids as sampled."""

import json

import pytest

from agentrl.config import load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

pytest.importorskip("textarena", reason="TextArena is not installed (pip install 'agentrl[textarena]')")

TINY = [  # tests/e2e/test_suites_train.py's tiny run, 3 steps, with a trajectory dump at each
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=2", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "trainer.total_steps=3", "trainer.test_freq=3", "trainer.eval_episodes=4", "trainer.save_freq=0",
    "trainer.progress=false", "trainer.logger=[jsonl]", "trainer.dump_trajectories_freq=1",
]


def test_textarena_config_trains_against_its_references(tmp_path):
    run = tmp_path / "run"
    cfg = load_config("configs/textarena.yaml", [*TINY, f"run_dir={run}", f"model.cache_dir={tmp_path / 'cache'}"])
    summary = train(cfg, log=lambda m: None)
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
    evals = [r for r in rows if "eval/success" in r]
    assert [r["step"] for r in evals] == [0, 3]
    # the random policy and binary search on the 4 evaluated secrets, the same at every evaluation
    assert len({r["eval/baseline_random"] for r in evals}) == 1 and 0.0 <= evals[0]["eval/baseline_random"] <= 1.0
    assert {r["eval/baseline_bisect"] for r in evals} == {1.0}
    assert summary["eval_baseline_random"] == evals[-1]["eval/baseline_random"]
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert "[GAME] You are Player 0. You are playing Guess The Number." in sample["text"]
    dumps = [read_dump(path) for _, path in list_dumps(run)]
    assert len(dumps) == 3
    for ep in (ep for dump in dumps for ep in dump["episodes"]):
        # the trained replies are the engine's samples: the trainer scores each id as the engine did
        generated = [k for k, m in enumerate(ep["mask"]) if int(m)]
        assert generated and len(ep["lp"]) == len(ep["old"]) == len(generated)
        assert all(abs(a - b) < 1e-3 for a, b in zip(ep["lp"], ep["old"]))
