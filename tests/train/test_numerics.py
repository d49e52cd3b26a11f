"""A non-finite loss stops the update with an error naming the loss term (it was skipped silently)."""

import copy

import pytest
import torch

from agentrl.config import ActorConfig
from agentrl.errors import TrainingError
from agentrl.trajectory import Trajectory
from agentrl.train.actor import Actor
from agentrl.train.batch import pack


def _batch(tokenizer, n=2):
    ids = tokenizer("user\nP _ _ G\nassistant\n<answer>Right</answer>")["input_ids"]
    mask = [0] * (len(ids) - 3) + [1, 1, 1]
    trajs = [Trajectory(list(ids), mask, [0.0] * len(ids), [0] * len(ids), [1.0], [len(ids) - 1], group_id=0,
                        env_seed=0) for _ in range(n)]
    return pack(trajs, tokenizer.pad_token_id)


def _scored(actor, batch, advantage):
    batch.old_logprobs = actor.compute_logprobs(batch)
    batch.behaviour_logprobs = batch.old_logprobs.clone()
    batch.advantages = torch.full_like(batch.loss_mask, advantage)
    return batch


def test_a_nan_advantage_is_an_error_naming_the_policy_loss(tiny_model, tiny_tokenizer):
    actor = Actor(copy.deepcopy(tiny_model), ActorConfig(ppo_mini_batch_size=2, micro_batch_size=2), temperature=1.0)
    before = {k: v.clone() for k, v in actor.model.state_dict().items()}
    batch = _scored(actor, _batch(tiny_tokenizer), float("nan"))
    with pytest.raises(TrainingError, match=r"^policy update: the vanilla policy loss \(loss/policy\) is nan \(not finite\); "
                                            r"inputs on generated tokens: advantages NOT finite, behaviour logprobs finite"):
        actor.update(batch)
    assert all(torch.equal(before[k], v) for k, v in actor.model.state_dict().items())


def test_non_finite_weights_are_an_error_naming_the_logprobs(tiny_model, tiny_tokenizer):
    model = copy.deepcopy(tiny_model)
    actor = Actor(model, ActorConfig(ppo_mini_batch_size=2, micro_batch_size=2, entropy_coeff=0.01), temperature=1.0)
    batch = _scored(actor, _batch(tiny_tokenizer), 1.0)
    with torch.no_grad():
        next(model.parameters()).fill_(float("inf"))
    with pytest.raises(TrainingError, match=r"current logprobs NOT finite"):
        actor.update(batch)


def test_finite_inputs_update_as_before(tiny_model, tiny_tokenizer):
    actor = Actor(copy.deepcopy(tiny_model), ActorConfig(ppo_mini_batch_size=2, micro_batch_size=2), temperature=1.0)
    stats = actor.update(_scored(actor, _batch(tiny_tokenizer), 1.0))
    assert stats["policy/grad_norm"] > 0 and stats["loss/policy"] == stats["loss/policy"]
