"""verl's names end to end: a two-step run with a non-default policy loss and estimator trains."""

import math
from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.assembly.trainer import build_trainer

from test_train import TINY  # tests/e2e is on sys.path (pytest prepend mode)

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def cache_dir(run_model_cache):
    return run_model_cache  # the test run's: a warm start other modules share


@pytest.mark.parametrize("loss_mode, estimator, agg", [
    ("gspo", "opo", "token-mean"),
    ("cispo", "grpo_passk", "seq-mean-token-sum-norm"),
    ("vanilla", "remax", "token-mean"),
])
def test_run_trains_with_verl_named_loss_and_estimator(tmp_path, cache_dir, loss_mode, estimator, agg):
    cfg = load_config(ROOT / "configs/frozen_lake.yaml",
                      [*TINY, f"run_dir={tmp_path}", f"model.cache_dir={cache_dir}", "trainer.test_freq=0",
                       f"actor.policy_loss.loss_mode={loss_mode}", f"algorithm.adv_estimator={estimator}",
                       f"actor.loss_agg_mode={agg}"])
    trainer = build_trainer(cfg, tmp_path, log=lambda m: None)
    # Two steps of a barely warm-started model give every episode the same reward (so every
    # estimator gives zero advantages); a per-episode bonus on its last generated id makes the
    # rewards differ, so the estimator and the loss have something to move the weights with.
    reward = trainer.reward

    def varied_reward(batch):
        out = reward(batch)
        positions = torch.arange(batch.loss_mask.shape[1]).expand_as(batch.loss_mask)
        last = torch.where(batch.loss_mask > 0, positions, -1).max(dim=1).values
        rows = (last >= 0).nonzero(as_tuple=True)[0]
        batch.token_rewards[rows, last[rows]] += 0.25 * (rows.float() + 1)
        return out

    trainer.reward = varied_reward
    before = {k: v.detach().clone() for k, v in trainer.actor.model.state_dict().items()}
    trainer.fit()
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss/policy" in r]
    assert len(rows) == 2
    assert all(math.isfinite(r["loss/policy"]) and math.isfinite(r["policy/grad_norm"]) for r in rows)
    after = trainer.actor.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    if estimator == "remax":  # a greedy episode per group was played as the baseline, and not trained
        assert all("reward/greedy_baseline" in r and r["rollout/episodes"] == cfg.rollout.batch_size for r in rows)
