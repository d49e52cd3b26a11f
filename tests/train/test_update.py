"""Actor.update: micro-batches accumulate to exactly the gradient of their mini-batch, and the
optimizer steps once per mini-batch per epoch."""

import copy

import pytest
import torch

from agentrl.config import ActorConfig
from agentrl.train.actor import Actor
from agentrl.train.batch import pack
from agentrl.trajectory import Trajectory

# Four episodes of different lengths; 1 marks a generated id.
MASKS = [[0, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1], [0, 0, 1, 1, 1, 0, 1]]


def _batch(actor):
    trajs = []
    for i, mask in enumerate(MASKS):
        ids = [(7 * i + 3 * k) % 300 + 5 for k in range(len(mask))]
        last = max(k for k, m in enumerate(mask) if m)
        trajs.append(Trajectory(ids, mask, [0.0] * len(ids), [0] * len(ids), [1.0], [last], i, i))
    batch = pack(trajs, pad_token_id=0)
    batch.old_logprobs = actor.compute_logprobs(batch)
    # A different advantage on every token, so any wrong weighting of a token shows.
    batch.advantages = torch.linspace(-1.0, 1.5, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
    return batch


def _update(model, mode, micro, mini=4, epochs=1, lr=0.1):
    """One Actor.update with plain SGD (the step is lr * gradient: a wrongly scaled gradient shows)."""
    model = copy.deepcopy(model)
    cfg = ActorConfig(lr=lr, ppo_mini_batch_size=mini, micro_batch_size=micro, ppo_epochs=epochs, grad_clip=0.0,
                      loss_agg_mode=mode, entropy_coeff=0.0, use_kl_loss=False)
    actor = Actor(model, cfg, temperature=1.0, horizon=8.0)
    actor.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    steps = []
    step = actor.optimizer.step
    actor.optimizer.step = lambda *a, **k: (steps.append(1), step(*a, **k))[1]
    batch = _batch(actor)
    stats = actor.update(batch)
    return model, stats, batch, len(steps)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                                  "dr-grpo"])
@pytest.mark.parametrize("micro", [1, 2])
def test_micro_batches_accumulate_to_the_update_of_one_big_batch(tiny_model, mode, micro):
    whole, whole_stats, _, _ = _update(tiny_model, mode, micro=4)
    split, split_stats, _, _ = _update(tiny_model, mode, micro=micro)
    assert split_stats["loss/policy"] == pytest.approx(whole_stats["loss/policy"], rel=1e-5, abs=1e-7)
    moved = 0.0
    for (name, a), b in zip(whole.state_dict().items(), split.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
        moved = max(moved, float((a - tiny_model.state_dict()[name]).abs().max()))
    assert moved > 1e-3  # the update did move the weights


@pytest.mark.parametrize("micro", [1, 4])
def test_loss_matches_the_formula_of_its_aggregation(tiny_model, micro):
    # At the first update the policy is the one that scored the batch: every ratio is 1, so the
    # clipped PPO loss of a token is -advantage, aggregated as the mode says.
    _, stats, batch, _ = _update(tiny_model, "token-mean", micro=micro)
    a, m = batch.advantages, batch.loss_mask
    assert stats["loss/policy"] == pytest.approx(float(-(a * m).sum() / m.sum()), rel=1e-5)
    _, stats, batch, _ = _update(tiny_model, "seq-mean-token-mean", micro=micro)
    per_seq = [float(-(a[i] * m[i]).sum() / m[i].sum()) for i in range(len(MASKS))]
    assert stats["loss/policy"] == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-5)


def test_one_optimizer_step_per_mini_batch_per_epoch(tiny_model):
    _, _, _, steps = _update(tiny_model, "token-mean", micro=1, mini=2, epochs=3)
    assert steps == 3 * (4 // 2)
    _, _, _, steps = _update(tiny_model, "token-mean", micro=2, mini=4, epochs=1)
    assert steps == 1
