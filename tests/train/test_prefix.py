"""Prefix-shared training (actor.share_prefixes, critic.share_prefixes): rows that start with the
same ids compute them once, and logprobs, entropies, values and gradients are the unshared pass's."""

import copy

import pytest
import torch

from agentrl.config import ActorConfig, CriticConfig, LoraConfig, load_config
from agentrl.errors import ConfigError
from agentrl.models.lora import apply_lora
from agentrl.train.actor import Actor, Reference
from agentrl.train.batch import pack
from agentrl.train.critic import Critic, ValueModel
from agentrl.train.forward import ForwardOptions, logprobs
from agentrl.trajectory import Trajectory

PROMPT = [(11 * k) % 290 + 5 for k in range(24)]  # a group's prompt: longer than the 16 ids sharing needs


def _rows(*rows):
    """Right-padded (ids, attention mask) of `rows`."""
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return ids, mask


def _reply(seed, n):
    return [(seed * 31 + 7 * k) % 290 + 5 for k in range(n)]


def _mixed():
    """A group of four sharing PROMPT (one diverging inside it, after 20 ids), a pair sharing a
    shorter one, and a row that shares nothing."""
    other = [(13 * k) % 290 + 5 for k in range(18)]
    return _rows(PROMPT + _reply(1, 5), PROMPT + _reply(2, 12), PROMPT[:20] + _reply(3, 3), PROMPT + _reply(4, 1),
                 other + _reply(5, 4), other + _reply(6, 9), _reply(7, 30))


def _all_shared():
    """Every row shares the prompt; two replies are equal (the prefix then stops one id short)."""
    return _rows(PROMPT + _reply(1, 6), PROMPT + _reply(1, 6), PROMPT + _reply(2, 1), PROMPT + _reply(3, 14))


def _nested():
    """Three segments of one turn share the prompt and a window of 30 ids more; a fourth row, the
    prompt only. Sharing the longer prefix among the three saves more than the prompt among four."""
    window = _reply(8, 30)
    return _rows(PROMPT + window + _reply(1, 4), PROMPT + window + _reply(2, 7), PROMPT + window + _reply(3, 2),
                 PROMPT + _reply(4, 9))


def _policy(tiny_model, lora):
    model = copy.deepcopy(tiny_model)
    if not lora:
        return model.train()
    model = apply_lora(model, LoraConfig(rank=4, alpha=8.0), seed=0)
    with torch.no_grad():  # adapters start as a no-op (B = 0): make them count
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(std=0.2)
    return model.train()


def _grads(model):
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _assert_same(shared, plain, mask, what):
    real = mask.bool()
    torch.testing.assert_close(shared[real], plain[real], rtol=1e-5, atol=1e-5, msg=what)
    assert (shared[:, 0] == 0).all()  # nothing predicts a first id


def _assert_same_grads(shared, plain):
    assert shared.keys() == plain.keys() and plain
    for name, g in plain.items():
        # To 1e-5 of the tensor's largest entry: a gradient sums many terms, summed in another order.
        scale = float(g.abs().max().clamp(min=1.0))
        torch.testing.assert_close(shared[name] / scale, g / scale, rtol=0.0, atol=1e-5, msg=f"gradient of {name}")
    assert max(float(g.abs().max()) for g in plain.values()) > 1e-3


def _count_ids(model):
    """A list that every forward pass appends its number of input ids to."""
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda _m, args, _out: seen.append(args[0].numel()))
    return seen


@pytest.mark.parametrize("batch", [_mixed, _all_shared, _nested])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_shared_logprobs_entropies_and_gradients_equal_the_unshared_pass(tiny_model, batch, packed, lora):
    model = _policy(tiny_model, lora)
    ids, mask = batch()
    weights = torch.linspace(-1.0, 1.0, ids.numel()).reshape(ids.shape)
    results = {}
    for share in (False, True):
        logp, entropy = logprobs(model, ids, mask, 0.7, packed, with_entropy=True, share_prefixes=share)
        ((logp * weights * mask).sum() + (entropy * mask).sum() * 0.1).backward()
        results[share] = logp.detach(), entropy.detach(), _grads(model)
    _assert_same(results[True][0], results[False][0], mask, "logprobs")
    _assert_same(results[True][1], results[False][1], mask, "entropies")
    _assert_same_grads(results[True][2], results[False][2])


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_shared_values_and_critic_gradients_equal_the_unshared_pass(tiny_model, packed, lora):
    critic = ValueModel(_policy(tiny_model, lora)).train()
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # a zero head would make every value 0
    ids, mask = _mixed()
    weights = torch.linspace(-1.0, 1.0, ids.numel()).reshape(ids.shape)
    results = {}
    for share in (False, True):
        values = critic(ids, mask, packed, share_prefixes=share)
        (values * weights * mask).sum().backward()
        results[share] = values.detach(), _grads(critic)
    _assert_same(results[True][0], results[False][0], mask, "values")
    _assert_same_grads(results[True][1], results[False][1])


def test_the_shared_prefix_is_computed_once(tiny_model):
    model = copy.deepcopy(tiny_model)
    seen = _count_ids(model)
    ids, mask = _all_shared()
    with torch.no_grad():
        logprobs(model, ids, mask, 1.0, packed=True, share_prefixes=True)
    # The prompt once (the shortest row keeps its one reply id), then each row's own ids, padded.
    assert seen == [len(PROMPT), 4 * 14]
    assert sum(seen) < int(mask.sum())


def test_rows_that_share_a_longer_prefix_share_it_among_themselves(tiny_model):
    model = copy.deepcopy(tiny_model)
    seen = _count_ids(model)
    ids, mask = _nested()
    with torch.no_grad():
        logprobs(model, ids, mask, 1.0, packed=False, share_prefixes=True)
    # One prefix, the three rows', then their suffixes; the fourth row runs whole in a pass of its own.
    assert seen == [len(PROMPT) + 30, 3 * 7, len(PROMPT) + 9]


def test_rows_that_share_no_prefix_take_the_unshared_pass(tiny_model):
    model = copy.deepcopy(tiny_model)
    seen = _count_ids(model)
    # Equal for 15 ids only: below the 16 sharing needs.
    ids, mask = _rows(PROMPT[:15] + _reply(1, 9), PROMPT[:15] + _reply(2, 4), _reply(3, 20))
    with torch.no_grad():
        for packed in (False, True):
            shared = logprobs(model, ids, mask, 1.0, packed, share_prefixes=True)
            _assert_same(shared, logprobs(model, ids, mask, 1.0, packed), mask, "logprobs")
    assert seen == [ids.numel()] * 2 + [int(mask.sum())] * 2  # one pass each: nothing shared
    # A single row, however long its prompt.
    one, one_mask = _rows(PROMPT + _reply(4, 3))
    with torch.no_grad():
        _assert_same(logprobs(model, one, one_mask, 1.0, False, share_prefixes=True),
                     logprobs(model, one, one_mask, 1.0, False), one_mask, "logprobs")


def _batch():
    """Two GRPO groups of three episodes (a prompt each), two rows more: ragged lengths."""
    other = [(13 * k) % 290 + 5 for k in range(20)]
    trajs = []
    for i in range(8):
        prompt = PROMPT if i < 3 else other if i < 6 else _reply(10 + i, 17)
        reply = _reply(i, 2 + 3 * i % 7)
        ids = prompt + reply
        mask = [0] * len(prompt) + [1] * len(reply)
        trajs.append(Trajectory(ids, mask, [0.0] * len(ids), [0] * len(ids), [1.0], [len(ids) - 1], i // 3, i))
    return pack(trajs, pad_token_id=0)


def _actor_update(model, share, packed, lora):
    """One Actor.update with plain SGD (the step is lr * gradient), KL and entropy terms on."""
    model = copy.deepcopy(model)
    cfg = ActorConfig(lr=0.1, ppo_mini_batch_size=8, micro_batch_size=4, grad_clip=0.0, entropy_coeff=0.01,
                      use_kl_loss=True, share_prefixes=share)
    actor = Actor(model, cfg, temperature=1.0, horizon=8.0, packed=packed)
    actor.optimizer = torch.optim.SGD(actor.master.params, lr=0.1)
    # As the run builds it: with LoRA the policy with its adapters off, else a frozen copy.
    frozen = model if lora else copy.deepcopy(model)
    reference = Reference(frozen, ForwardOptions(4, packed=packed, share_prefixes=share), 1.0)
    batch = _batch()
    batch.old_logprobs = actor.compute_logprobs(batch)
    batch.ref_logprobs = reference.compute_logprobs(batch)
    batch.advantages = torch.linspace(-1.0, 1.5, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
    stats = actor.update(batch)
    return model, batch, stats


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_actor_and_reference_with_shared_prefixes_take_the_unshared_step(tiny_model, packed, lora):
    policy = _policy(tiny_model, lora)
    plain, plain_batch, plain_stats = _actor_update(policy, False, packed, lora)
    shared, shared_batch, shared_stats = _actor_update(policy, True, packed, lora)
    real = plain_batch.attention_mask.bool()
    for name in ("old_logprobs", "ref_logprobs"):
        _assert_same(getattr(shared_batch, name), getattr(plain_batch, name), real, name)
    for key in ("loss/policy", "loss/kl", "policy/entropy"):
        assert shared_stats[key] == pytest.approx(plain_stats[key], rel=1e-5, abs=1e-6), key
    moved = 0.0
    for (name, a), b in zip(plain.state_dict().items(), shared.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
        moved = max(moved, float((a - policy.state_dict()[name]).abs().max()))
    assert moved > 1e-3


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_critic_with_shared_prefixes_takes_the_unshared_step(tiny_model, packed):
    models = {}
    for share in (False, True):
        torch.manual_seed(0)
        critic = Critic(ValueModel(tiny_model), CriticConfig(ppo_mini_batch_size=8, micro_batch_size=4, grad_clip=0.0,
                                                             share_prefixes=share), horizon=8.0, packed=packed)
        critic.optimizer = torch.optim.SGD(critic.master.params, lr=0.1)
        batch = _batch()
        batch.values = critic.compute_values(batch)
        batch.returns = torch.linspace(-1.0, 1.5, batch.loss_mask.numel()).reshape(batch.loss_mask.shape)
        critic.update(batch)
        critic.update(batch)  # the second step moves the body too (the head is no longer 0)
        models[share] = critic.model, critic.compute_values(batch)
    _assert_same(models[True][1], models[False][1], _batch().loss_mask, "values")
    for (name, a), b in zip(models[False][0].state_dict().items(), models[True][0].state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


def test_sharing_with_gradient_checkpointing_is_refused():
    for role in ("actor", "critic"):
        with pytest.raises(ConfigError, match=rf"{role}\.share_prefixes=true .*model\.enable_gradient_checkpointing"):
            load_config(None, [f"{role}.share_prefixes=true", "model.enable_gradient_checkpointing=true"])
