"""End-to-end: the shipped MiniGrid config trains the embedded model for 3 steps on BabyAI's GoToObj,
logs its references, and trains on the engine's own ids."""

import json

import pytest

from agentrl.config import load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

TINY = [  # tests/e2e/test_suites_train.py's tiny sizes, with 3 steps and the trajectories dumped
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=2", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "trainer.total_steps=3", "trainer.test_freq=3", "trainer.eval_episodes=4", "trainer.save_freq=0",
    "trainer.progress=false", "trainer.logger=[jsonl]", "trainer.dump_trajectories_freq=1",
    "env.max_turns=4", "env.args.kwargs.max_steps=4",
]


def test_minigrid_config_trains_on_the_engines_ids(tmp_path):
    pytest.importorskip("minigrid", reason="minigrid is not installed (pip install 'agentrl[minigrid]')")
    run = tmp_path / "run"
    cfg = load_config("configs/minigrid.yaml", [*TINY, f"run_dir={run}", f"model.cache_dir={tmp_path / 'cache'}"])
    summary = train(cfg, log=lambda m: None)
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
    evals = [r for r in rows if "eval/success" in r]
    assert [r["step"] for r in evals] == [0, 3]
    # within 4 steps the bot reaches some objects, a random policy fewer or as many
    assert 0.0 <= evals[0]["eval/baseline_random"] <= evals[0]["eval/baseline_bot"] <= 1.0
    assert summary["eval_baseline_random"] == evals[-1]["eval/baseline_random"]
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert "Mission: go to the" in sample["text"] and "Carrying: nothing." in sample["text"]
    dumps = [read_dump(path) for _, path in list_dumps(run)]
    assert len(dumps) == 3
    for ep in (ep for dump in dumps for ep in dump["episodes"]):
        generated = [k for k, m in enumerate(ep["mask"]) if int(m)]
        # the replies are the engine's samples: the trainer scores each id as the engine did
        assert len(ep["lp"]) == len(ep["old"]) == len(generated) > 0
        assert all(abs(a - b) < 1e-3 for a, b in zip(ep["lp"], ep["old"]))
