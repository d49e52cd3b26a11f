"""GRPO advantages on hand-computed cases."""

import math

import pytest
import torch

from agentrl.algos.advantages import compute_advantages, grpo
from agentrl.algos.estimator import EstimatorInput
from agentrl.config import AlgorithmConfig
from agentrl.errors import RegistryError


def _rewards(scores, width=5, pos=2):
    r = torch.zeros(len(scores), width)
    r[:, pos] = torch.tensor(scores, dtype=torch.float32)
    return r


def test_grpo_hand_computed():
    # group 0: scores 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3); group 1: 2, 4 -> mean 3, std sqrt(2)
    scores = [1.0, 0.0, 0.0, 1.0, 2.0, 4.0]
    index = torch.tensor([0, 0, 0, 0, 1, 1])
    mask = torch.ones(6, 5)
    mask[:, 0] = 0
    adv, ret = grpo(EstimatorInput(_rewards(scores), mask, index, None, AlgorithmConfig(credit="outcome")))
    s0 = math.sqrt(1 / 3)
    expected = [0.5 / s0, -0.5 / s0, -0.5 / s0, 0.5 / s0, -1 / math.sqrt(2), 1 / math.sqrt(2)]
    for i, e in enumerate(expected):
        assert adv[i, 1:].tolist() == pytest.approx([e] * 4, rel=1e-5)
        assert adv[i, 0] == 0.0
    assert torch.equal(adv, ret)


def test_grpo_sums_to_zero_in_each_group_and_respects_mask():
    torch.manual_seed(0)
    scores = torch.randn(12).tolist()
    index = torch.arange(12) // 4
    mask = (torch.rand(12, 7) > 0.3).float()
    adv, _ = grpo(EstimatorInput(_rewards(scores, 7, 6), mask, index, None, AlgorithmConfig(credit="outcome")))
    per_seq = torch.tensor([adv[i][mask[i] > 0][0] if mask[i].any() else 0.0 for i in range(12)])
    for g in range(3):
        rows = [i for i in range(12) if index[i] == g and mask[i].any()]
        if len(rows) == 4:
            assert abs(float(per_seq[rows].sum())) < 1e-5
    assert torch.all(adv[mask == 0] == 0)


def test_dr_grpo_does_not_divide_and_singleton_group_keeps_raw_score():
    index = torch.tensor([0, 0, 1])
    mask = torch.ones(3, 5)
    adv, _ = grpo(EstimatorInput(_rewards([3.0, 1.0, 5.0]), mask, index, None,
                                 AlgorithmConfig(norm_adv_by_std_in_grpo=False, credit="outcome")))
    assert adv[:, -1].tolist() == pytest.approx([1.0, -1.0, 5.0])


def test_equal_rewards_give_zero_advantage():
    adv, _ = grpo(EstimatorInput(_rewards([1.0] * 4), torch.ones(4, 5), torch.zeros(4, dtype=torch.long), None,
                                 AlgorithmConfig(credit="outcome")))
    assert torch.all(adv == 0)


def test_unknown_estimator_lists_known():
    with pytest.raises(RegistryError, match="Known: .*grpo"):
        compute_advantages("grpoo", EstimatorInput(torch.zeros(1, 2), torch.ones(1, 2),
                                                    torch.zeros(1, dtype=torch.long), None, AlgorithmConfig()))


def test_turn_returns_cross_observation_gaps():
    from agentrl.algos.returns import turn_returns

    # two turns: generated ids at 1-2 and 5-6, an observation (mask 0) between them
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0.0]])
    rewards = torch.tensor([[0, 0, 0.5, 0, 0, 0, 1.0, 0]])
    assert turn_returns(rewards, mask, 1.0).tolist() == [[0, 1.5, 1.5, 0, 0, 1.0, 1.0, 0]]
    assert turn_returns(rewards, mask, 0.5).tolist() == [[0, 1.0, 1.0, 0, 0, 1.0, 1.0, 0]]


def test_turn_credit_grpo_hand_computed():
    mask = torch.tensor([[0, 1, 0, 1.0], [0, 1, 0, 1.0]])
    rewards = torch.tensor([[0, 1.0, 0, 0], [0, 0, 0, 1.0]])
    # turn returns (gamma=1): row 0 -> [1, 0], row 1 -> [1, 1]; turn 1: both 1 -> 0;
    # turn 2: 0 vs 1 -> mean 0.5, unbiased std 0.70711 -> -+0.70711
    adv, _ = grpo(EstimatorInput(rewards, mask, torch.tensor([0, 0]), None, AlgorithmConfig(credit="turn", gamma=1.0)))
    assert torch.allclose(adv, torch.tensor([[0, 0, 0, -0.70711], [0, 0, 0, 0.70711]]), atol=1e-5)


def test_gigpo_compares_turns_from_the_same_state():
    from agentrl.algos.advantages import gigpo

    mask = torch.tensor([[0, 1, 0, 1.0], [0, 1, 0, 1.0]])
    rewards = torch.tensor([[0, 1.0, 0, 0], [0, 0, 0, 0.0]])
    # both episodes start in state 0; row 0's second turn is in state 1, row 1's in state 2
    states = torch.tensor([[-1, 0, -1, 1], [-1, 0, -1, 2]])
    cfg = AlgorithmConfig(gamma=0.0, norm_adv_by_std_in_grpo=False)
    adv, _ = gigpo(EstimatorInput(rewards, mask, torch.tensor([0, 0]), None, cfg, states))
    # episode level: scores 1 and 0 -> +0.5 / -0.5; step level in state 0: 1 - 0.5 and 0 - 0.5;
    # states 1 and 2 were each visited once: no step-level advantage
    assert torch.allclose(adv, torch.tensor([[0, 1.0, 0, 0.5], [0, -1.0, 0, -0.5]]), atol=1e-5)


def test_on_truncation_bootstrap_adds_the_last_value_to_a_truncated_rows_gae():
    """GAE of a truncated row: delta_T = r_T + gamma V(s_T) - V(s_T) at its last generated id;
    a terminated row keeps V = 0 after its end."""
    from agentrl.algos.gae import bootstrap_truncated

    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 0, 0]], dtype=torch.float32)
    rewards = torch.tensor([[0, 0, 0, 1.0, 0], [0, 0, 0.5, 0, 0]])
    values = torch.tensor([[0, 0.2, 0.4, 0.8, 0], [0, 0.3, 0.6, 0, 0]])
    cfg = AlgorithmConfig(adv_estimator="gae", gamma=0.9, lam=1.0, credit="token")
    truncated = torch.tensor([True, False])
    boot = bootstrap_truncated(rewards, values, mask, truncated, cfg.gamma)
    assert boot[0, 3] == pytest.approx(1.0 + 0.9 * 0.8) and torch.equal(boot[1], rewards[1])
    assert torch.equal(rewards[0, 3], torch.tensor(1.0))  # the batch's own rewards are left as they were
    _, returns = compute_advantages("gae", EstimatorInput(boot, mask, torch.tensor([0, 0]), values, cfg))
    # lam = 1: the return of each id is the discounted sum of what follows, plus gamma V(s_T) when cut off.
    assert returns[0, 1:4].tolist() == pytest.approx([0.81 * 1.72, 0.9 * 1.72, 1.72])
    assert returns[1, 1:3].tolist() == pytest.approx([0.45, 0.5])
