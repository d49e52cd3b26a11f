"""Padding-free (packed) forward passes equal the padded ones; token-budget micro-batches give the
gradient of one batch; bfloat16 weights are stepped through float32 master copies."""

import copy

import pytest
import torch

from agentrl.config import ActorConfig
from agentrl.train.actor import Actor, batch_logprobs, token_logprobs
from agentrl.train.batch import micro_batches, pack
from agentrl.train.critic import ValueModel
from agentrl.train.forward import ForwardOptions, packed_logprobs
from agentrl.trajectory import Trajectory

# Episodes of different lengths (1 marks a generated id), so rows carry different padding.
MASKS = [[0, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1, 1, 0, 1],
         [0, 1, 1], [0, 0, 1, 1, 1, 1, 0, 0, 1]]


def _batch(vocab=300):
    trajs = []
    for i, mask in enumerate(MASKS):
        ids = [(7 * i + 3 * k) % (vocab - 5) + 5 for k in range(len(mask))]
        last = max(k for k, m in enumerate(mask) if m)
        trajs.append(Trajectory(ids, mask, [0.0] * len(ids), [0] * len(ids), [1.0], [last], i // 2, i))
    return pack(trajs, pad_token_id=0)


def test_packed_logprobs_and_entropy_equal_the_padded_ones(tiny_model):
    b = _batch()
    with torch.no_grad():
        lp, ent = token_logprobs(tiny_model, b.input_ids, b.attention_mask, 0.7, with_entropy=True)
        plp, pent = packed_logprobs(tiny_model, b.input_ids, b.attention_mask, 0.7, with_entropy=True)
    real = b.attention_mask.bool()
    torch.testing.assert_close(plp[real], lp[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pent[real], ent[real], rtol=1e-5, atol=1e-5)
    assert (plp[~real] == 0).all() and (plp[:, 0] == 0).all()  # padding and first ids: nothing predicts them
    # In batches, any grouping of rows: the same logprobs (packed within each micro-batch).
    packed = batch_logprobs(tiny_model, b, ForwardOptions(2, max_tokens=12, packed=True), 0.7)
    torch.testing.assert_close(packed[real], lp[real], rtol=1e-5, atol=1e-5)


def test_packed_values_equal_the_padded_ones(tiny_model):
    b = _batch()
    critic = ValueModel(tiny_model)
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # a zero head would make every value 0
    with torch.no_grad():
        padded = critic(b.input_ids, b.attention_mask)
        packed = critic(b.input_ids, b.attention_mask, packed=True)
    real = b.attention_mask.bool()
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)
    assert padded[real].abs().max() > 1e-3


@pytest.mark.parametrize("packed", [False, True])
def test_token_budget_micro_batches_stay_within_it_and_cover_every_row(packed):
    b = _batch()
    rows = torch.arange(b.size)
    lengths = b.attention_mask.sum(-1)
    groups = micro_batches(b.attention_mask, rows, 99, max_tokens=16, packed=packed)
    assert sorted(torch.cat(groups).tolist()) == rows.tolist()
    for g in groups:
        cost = int(lengths[g].sum()) if packed else int(lengths[g].max()) * len(g)
        assert cost <= 16 or len(g) == 1  # a row longer than the budget goes alone (none is here)
    assert len(groups) > 1 and max(len(g) for g in groups) > 1  # short rows share a pass
    assert [len(g) for g in micro_batches(b.attention_mask, rows, 4)] == [4, 2]  # no budget: by count
    assert [g.tolist() for g in micro_batches(b.attention_mask, rows, 4, max_tokens=5)][0] == [1]  # 11 ids alone


def _update(model, micro, max_tokens=0, packed=False):
    """One Actor.update with plain SGD: the step is lr * gradient, so any wrongly scaled micro-batch shows."""
    model = copy.deepcopy(model)
    cfg = ActorConfig(lr=0.1, ppo_mini_batch_size=6, micro_batch_size=micro, grad_clip=0.0, entropy_coeff=0.01,
                      max_tokens_per_micro_batch=max_tokens, loss_agg_mode="seq-mean-token-mean")
    actor = Actor(model, cfg, temperature=1.0, horizon=8.0, packed=packed)
    actor.optimizer = torch.optim.SGD(actor.master.params, lr=0.1)
    batch = _batch()
    batch.old_logprobs = actor.compute_logprobs(batch)
    batch.advantages = torch.linspace(-1.0, 1.5, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
    stats = actor.update(batch)
    return model, stats


@pytest.mark.parametrize("packed", [False, True])
def test_token_budget_micro_batches_give_the_gradient_of_one_batch(tiny_model, packed):
    whole, whole_stats = _update(tiny_model, micro=6)
    split, split_stats = _update(tiny_model, micro=6, max_tokens=14, packed=packed)
    assert split_stats["loss/policy"] == pytest.approx(whole_stats["loss/policy"], rel=1e-5, abs=1e-7)
    moved = 0.0
    for (name, a), b in zip(whole.state_dict().items(), split.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
        moved = max(moved, float((a - tiny_model.state_dict()[name]).abs().max()))
    assert moved > 1e-3


def test_gradient_checkpointing_gives_the_same_update(tiny_model):
    plain, _ = _update(tiny_model, micro=3)
    model = copy.deepcopy(tiny_model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_gradient_checkpointing
    checkpointed, _ = _update(model, micro=3)
    for (name, a), b in zip(plain.state_dict().items(), checkpointed.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


def test_bfloat16_weights_step_through_float32_master_copies(tiny_model):
    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    cfg = ActorConfig(lr=1e-6, ppo_mini_batch_size=6, micro_batch_size=6, grad_clip=0.0)
    actor = Actor(model, cfg, temperature=1.0, horizon=8.0)
    assert actor.master.active and all(p.dtype == torch.float32 for p in actor.master.params)
    before = {k: v.clone() for k, v in actor.master.state_dict().items()}
    batch = _batch()
    batch.old_logprobs = actor.compute_logprobs(batch)
    batch.advantages = torch.linspace(-1.0, 1.5, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
    actor.update(batch)
    params = [p for p in model.parameters() if p.requires_grad]
    assert all(s["exp_avg"].dtype == torch.float32 for s in actor.optimizer.state.values())
    master_moved = model_moved = 0
    for i, master in enumerate(actor.master.params):
        assert master.dtype == torch.float32 and params[i].dtype == torch.bfloat16
        assert torch.equal(params[i], master.to(torch.bfloat16))  # the model holds the rounded master
        master_moved += int((master != before[i]).sum())
        model_moved += int((params[i] != before[i].to(torch.bfloat16)).sum())
    # Steps of lr 1e-6 are mostly below a bfloat16 weight's resolution: only the master keeps them.
    assert master_moved > 10 * model_moved
