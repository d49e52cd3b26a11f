"""model.warm_start.demo_pool: a long warm start plays its first batches only, then trains on them again."""

from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.assembly.plan import plan
from agentrl.warm_start.recipe import build_tiny

ROOT = Path(__file__).parents[2]
SMALL = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
         "model.tiny.vocab_size=300", "model.warm_start.batch_size=4", "model.warm_start.max_steps=7",
         "model.warm_start.floor_tolerance=0", "env.max_turns=3", "env.args.max_steps=3"]


@pytest.mark.parametrize("pool, played", [(0, [1, 2, 3, 4, 5, 6, 7]), (3, [1, 2, 3])])
def test_the_pool_bounds_the_demonstrations_played_not_the_steps_trained(monkeypatch, tmp_path, pool, played):
    asked: list[int] = []
    original = TaskSource.demonstrations

    def counted(self, step, tags):
        asked.append(step)
        return original(self, step, tags)

    monkeypatch.setattr(TaskSource, "demonstrations", counted)
    cfg = load_config(ROOT / "configs" / "frozen_lake.yaml",
                      [*SMALL, f"model.warm_start.demo_pool={pool}", f"model.cache_dir={tmp_path}"])
    lines: list[str] = []
    build_tiny(plan(cfg), lines.append)
    assert asked == played
    assert any(line.startswith("warm start done: 7 steps") for line in lines), lines
