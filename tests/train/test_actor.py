"""The actor's learning-rate schedule."""

import math

import pytest
import torch

from agentrl.config import ActorConfig
from agentrl.train.actor import Actor, lr_factor


def test_constant_schedule_is_flat():
    assert [lr_factor(s, 10, "constant") for s in range(10)] == [1.0] * 10


def test_cosine_hand_computed():
    # 0.5 * (1 + cos(pi * s / 4)) for s = 0..3
    want = [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]
    assert [lr_factor(s, 4, "cosine") for s in range(4)] == pytest.approx(want)
    # the floor: min_ratio + (1 - min_ratio) * the same curve
    assert lr_factor(2, 4, "cosine", min_ratio=0.2) == pytest.approx(0.2 + 0.8 * 0.5)


def test_warmup_ramps_then_decays():
    # 20 steps, 20% warmup = 4 steps: 1/4 .. 4/4, then cosine from 1 over the 16 left
    got = [lr_factor(s, 20, "cosine", warmup_ratio=0.2) for s in range(6)]
    assert got[:5] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    assert got[5] == pytest.approx(0.5 * (1 + math.cos(math.pi / 16)))
    assert lr_factor(1, 20, "constant", warmup_ratio=0.2) == 0.5


def test_schedule_sets_the_optimizer_lr():
    actor = Actor(torch.nn.Linear(2, 2), ActorConfig(lr=1e-3, lr_scheduler_type="cosine"), temperature=1.0)
    assert actor.schedule(2, 4) == pytest.approx(5e-4)
    assert all(g["lr"] == pytest.approx(5e-4) for g in actor.optimizer.param_groups)
