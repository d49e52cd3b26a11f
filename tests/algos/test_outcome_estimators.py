"""verl's episode-level estimators opo, grpo_passk, gpg, remax: by hand, against the loop
reference (agentrl.algos.reference) on ragged multi-turn batches, and against verl's formulas."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import reference
from agentrl.algos.advantages import compute_advantages
from agentrl.algos.estimator import EstimatorInput
from agentrl.algos.outcome_estimators import remax_advantages
from agentrl.config import AlgorithmConfig, load_config
from agentrl.errors import ConfigError
from agentrl.registry import ESTIMATORS

NAMES = ["opo", "grpo_passk", "gpg", "remax"]


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def _both(name, rewards, mask, index, **cfg):
    """(vectorised, reference) outputs for the same inputs."""
    inputs = EstimatorInput(_t(rewards), _t(mask), torch.tensor(index), None, AlgorithmConfig(**cfg))
    return compute_advantages(name, inputs), reference.reference_advantages(name, inputs)


def _check(name, rewards, mask, index, adv, ret=None, **cfg):
    for got_adv, got_ret in _both(name, rewards, mask, index, **cfg):
        torch.testing.assert_close(got_adv, _t(adv), atol=1e-5, rtol=0)
        torch.testing.assert_close(got_ret, _t(adv if ret is None else ret), atol=1e-5, rtol=0)


def test_registered_with_the_common_signature():
    assert set(NAMES) <= set(ESTIMATORS.names())


# ---------------------------------------------------------------------------- by hand
MASK3 = [[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0]]
REWARDS3 = [[0, 0, 1, 0], [0, 0, 0, 2], [0, 5, 0, 0]]


@pytest.mark.parametrize("credit", ["token", "outcome"])
def test_opo_by_hand(credit):
    # group 0: lengths 2 and 3, scores 1 and 2 -> baseline (2*1 + 3*2) / 5 = 1.6;
    # group 1 (row 2) alone: baseline 0, raw score 5
    adv = [[0, -0.6, -0.6, 0], [0, 0.4, 0.4, 0.4], [0, 5, 0, 0]]
    _check("opo", REWARDS3, MASK3, [0, 0, 1], adv, credit=credit)


def test_opo_turn_credit_scores_by_the_first_turn_return():
    # gamma 0.5; row 0: turns rewarded 1 and 2 -> G_1 = 1 + 0.5 * 2 = 2; row 1: the 7 on the prompt
    # belongs to no turn, the 1 after turn 1 is turn 1's -> G_1 = 1. Equal lengths: baseline 1.5.
    mask, rewards = [[0, 1, 0, 1], [0, 1, 0, 1]], [[0, 1, 0, 2], [7, 0, 1, 0]]
    _check("opo", rewards, mask, [0, 0], [[0, 0.5, 0, 0.5], [0, -0.5, 0, -0.5]], credit="turn", gamma=0.5)


def test_grpo_passk_by_hand():
    mask = [[1, 1]] * 5
    # group 0 scores 1, 3, 2: only row 1 gets (3 - 2) / (std 1 + eps); group 1 ties at 2: all 0
    rewards = [[0, 1], [0, 3], [0, 2], [2, 0], [2, 0]]
    top = 1 / (1 + 1e-6)
    adv = [[0, 0], [top, top], [0, 0], [0, 0], [0, 0]]
    _check("grpo_passk", rewards, mask, [0, 0, 0, 1, 1], adv, credit="token")
    raw = [[0, 0], [1, 1], [0, 0], [0, 0], [0, 0]]
    _check("grpo_passk", rewards, mask, [0, 0, 0, 1, 1], raw, credit="token", norm_adv_by_std_in_grpo=False)


def test_grpo_passk_group_of_one_is_refused():
    with pytest.raises(ValueError, match="at least 2 episodes"):
        compute_advantages("grpo_passk", EstimatorInput(_t([[1.0]]), _t([[1.0]]), torch.tensor([0]), None,
                                                         AlgorithmConfig(credit="token")))
    with pytest.raises(ConfigError, match="group_size >= 2"):
        load_config(None, ["algorithm.adv_estimator=grpo_passk", "rollout.group_size=1"])


def test_gpg_by_hand():
    # scores 1, 3 | 0, 0: 2 of 4 non-zero -> alpha 2; group means 2 and 0
    mask, rewards = [[1, 1]] * 4, [[1, 0], [0, 3], [0, 0], [0, 0]]
    _check("gpg", rewards, mask, [0, 0, 1, 1], [[-2, -2], [2, 2], [0, 0], [0, 0]], credit="token")


def test_remax_by_hand():
    # reward-to-go over generated ids: row 0 [_, 1+0+2, 2, 2] (score 3), row 1 [_, 1, 1, 1] (score 1);
    # baseline: the other episode's score (3 for row 1, 1 for row 0)
    mask, rewards = [[0, 1, 1, 1], [0, 1, 1, 1]], [[0, 1, 0, 2], [0, 0, 0, 1]]
    adv = [[0, 2, 1, 1], [0, -2, -2, -2]]
    ret = [[0, 3, 2, 2], [0, 1, 1, 1]]
    _check("remax", rewards, mask, [0, 0], adv, ret, credit="token")


def test_remax_in_a_run_subtracts_the_greedy_rollouts_reward():
    # verl's ReMax: b = the reward of the group's greedy episode (2.5 for group 0); a row without
    # one (NaN: row 2's group played none) falls back to the leave-one-out mean (0 for a group of one)
    mask, rewards = [[0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 0, 0]], [[0, 1, 0, 2], [0, 0, 0, 1], [0, 4, 0, 0]]
    inputs = EstimatorInput(_t(rewards), _t(mask), torch.tensor([0, 0, 1]), None, AlgorithmConfig(credit="token"),
                            reward_baselines=_t([2.5, 2.5, float("nan")]))
    adv, ret = compute_advantages("remax", inputs)
    torch.testing.assert_close(ret, _t([[0, 3, 2, 2], [0, 1, 1, 1], [0, 4, 0, 0]]))
    torch.testing.assert_close(adv, _t([[0, 0.5, -0.5, -0.5], [0, -1.5, -1.5, -1.5], [0, 4, 0, 0]]))


def test_only_remax_asks_for_greedy_baselines():
    from agentrl.algos.advantages import uses_greedy_baseline

    assert [n for n in ESTIMATORS.names() if uses_greedy_baseline(n)] == ["remax"]


def test_remax_advantages_is_verls_formula_with_any_baseline():
    # verl: returns = reverse cumsum of masked rewards, advantages = returns - baseline (greedy reward)
    rewards, mask = _t([[0, 1, 0, 2]]), _t([[0, 1, 1, 1]])
    adv, ret = remax_advantages(rewards, mask, _t([0.5]))
    torch.testing.assert_close(ret, _t([[0, 3, 2, 2]]))
    torch.testing.assert_close(adv, _t([[0, 2.5, 1.5, 1.5]]))


# ---------------------------------------------------------------------------- (b) loop reference
REWARDS = [-1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 2.0]


@st.composite
def batches(draw, min_group=2):
    """(rewards, mask, index): prompt zeros, then runs of generated ids with gaps and padding."""
    width = draw(st.integers(2, 8))
    sizes = draw(st.lists(st.integers(min_group, 3), min_size=1, max_size=3))
    index = draw(st.permutations([g for g, n in enumerate(sizes) for _ in range(n)]))
    mask = []
    for _ in index:
        prompt = draw(st.integers(0, width - 1))
        rest = draw(st.lists(st.booleans(), min_size=width - prompt - 1, max_size=width - prompt - 1))
        mask.append([0.0] * prompt + [1.0] + [float(b) for b in rest])
    anywhere = draw(st.booleans())
    rewards = [[draw(st.sampled_from(REWARDS)) if m or anywhere else 0.0 for m in row] for row in mask]
    return _t(rewards), _t(mask), torch.tensor(index)


@pytest.mark.parametrize("credit", ["token", "turn", "outcome"])
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None, database=None)
@given(data=st.data())
def test_vectorised_matches_reference(name, credit, data):
    rewards, mask, index = data.draw(batches())
    config = AlgorithmConfig(credit=credit, gamma=data.draw(st.sampled_from([1.0, 0.5])),
                             norm_adv_by_std_in_grpo=data.draw(st.booleans()))
    adv, ret = compute_advantages(name, EstimatorInput(rewards, mask, index, None, config))
    ref_adv, ref_ret = reference.reference_advantages(name, EstimatorInput(rewards, mask, index, None, config))
    torch.testing.assert_close(adv, ref_adv, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-5, rtol=0)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


# ---------------------------------------------------------------------------- (c) verl's formulas
def _verl_opo(scores, lengths, index):
    out = scores.clone()
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        if len(rows) > 1:
            s, n = scores[rows], lengths[rows]
            out[rows] = s - (n * s).sum() / n.sum()
    return out


def _verl_gpg(scores, index):
    alpha = len(scores) / max(int(torch.count_nonzero(scores)), 1)
    out = scores.clone()
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        mean = scores[rows].mean() if len(rows) > 1 else 0.0
        out[rows] = alpha * (scores[rows] - mean)
    return out


def _verl_passk(scores, index, norm):
    out = torch.zeros_like(scores)
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        top, idx = torch.topk(scores[rows], 2)
        gap = top[0] - top[1]
        out[rows[int(idx[0])]] = gap / (scores[rows].std() + 1e-6) if norm else gap
    return out


@settings(max_examples=40, deadline=None, database=None)
@given(batch=batches(), norm=st.booleans())
def test_matches_verl_on_outcome_scores(batch, norm):
    rewards, mask, index = batch
    config = AlgorithmConfig(credit="token", norm_adv_by_std_in_grpo=norm)
    scores, ids = rewards.sum(-1), index.tolist()
    for name, want in [("opo", _verl_opo(scores, mask.sum(-1), ids)), ("gpg", _verl_gpg(scores, ids)),
                       ("grpo_passk", _verl_passk(scores, ids, norm))]:
        adv, _ = compute_advantages(name, EstimatorInput(rewards, mask, index, None, config))
        torch.testing.assert_close(adv, want.unsqueeze(-1) * mask, atol=1e-5, rtol=0)
