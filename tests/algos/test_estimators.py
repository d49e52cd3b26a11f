"""Every estimator against hand-computed numbers, the loop reference, and verl's formulas.

(a) small cases computed by hand, credit=token and credit=turn (vectorised and reference);
(b) hypothesis: vectorised == agentrl.algos.reference on ragged multi-turn batches, exact zeros
    off the mask, GRPO advantages summing to zero within each group;
(c) agreement with transcriptions of verl's core_algos on single-turn masks;
(d) the deliberate difference: our masks are transparent, verl's REINFORCE++ restarts at them.
"""

import math
from collections import defaultdict

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentrl.algos import reference
from agentrl.algos.advantages import compute_advantages
from agentrl.algos.estimator import EstimatorInput
from agentrl.config import AlgorithmConfig

NAMES = ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae"]
SETTINGS = settings(max_examples=50, deadline=None, database=None)
R2 = 1 / math.sqrt(2)  # 0.70711


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def _check(name, rewards, mask, index, adv, ret=None, values=None, state_ids=None, **cfg):
    """Vectorised (and, for the estimators it has, the reference) give these advantages/returns."""
    args = (_t(rewards), _t(mask), torch.tensor(index), None if values is None else _t(values),
            AlgorithmConfig(**cfg))
    sid = None if state_ids is None else torch.tensor(state_ids)
    outputs = [compute_advantages(name, EstimatorInput(*args, state_ids=sid))]
    if name in reference.REFERENCE:
        outputs.append(reference.reference_advantages(name, EstimatorInput(*args)))
    for got_adv, got_ret in outputs:
        torch.testing.assert_close(got_adv, _t(adv), atol=1e-5, rtol=0)
        torch.testing.assert_close(got_ret, _t(adv if ret is None else ret), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------- (a) by hand
# Shared multi-turn pair (gamma 0.5): two turns per row, generated ids 1 and 3.
#   row 0: rewards 1 (turn 1) and 2 (turn 2)          -> G = [1 + 0.5*2, 2] = [2, 2]
#   row 1: 7 on the prompt (before any turn: ignored), 1 on the observation after turn 1
#          (counts for turn 1), nothing for turn 2   -> G = [1, 0]
PAIR_MASK = [[0, 1, 0, 1], [0, 1, 0, 1]]
PAIR_REWARDS = [[0, 1, 0, 2], [7, 0, 1, 0]]
# Turn credit compares turn k with turn k: turn 1 returns 2 vs 1, turn 2 returns 2 vs 0.
PAIR_Z = [[0, R2, 0, R2], [0, -R2, 0, -R2]]  # each turn: (G - mean) / unbiased std


def test_grpo_by_hand():
    # scores: row 0 = 1, row 1 = 2 + 1 (the reward on padding counts) = 3 -> mean 2, std sqrt(2);
    # row 2 is a group of one: mean 0, std 1 -> raw score 5.
    mask, rewards = [[0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 0, 0]], [[0, 0, 1, 0], [0, 0, 2, 1], [0, 5, 0, 0]]
    adv = [[0, -R2, -R2, 0], [0, R2, R2, 0], [0, 5, 0, 0]]
    for credit in ("token", "outcome"):
        _check("grpo", rewards, mask, [0, 0, 1], adv, credit=credit)
    # Dr. GRPO: no division by std.
    _check("grpo", rewards, mask, [0, 0, 1], [[0, -1, -1, 0], [0, 1, 1, 0], [0, 5, 0, 0]],
           credit="token", norm_adv_by_std_in_grpo=False)
    # turn credit: every turn compared with the same turn of the group's other episodes
    _check("grpo", PAIR_REWARDS, PAIR_MASK, [0, 0], PAIR_Z, credit="turn", gamma=0.5)
    # a turn number only one episode of the group reached has no baseline: 0 (row 1's turns 2 and 3;
    # a raw return there biases a length-normalised loss, tests/algos/test_wait_gradient.py) ...
    _check("grpo", [[1, 0, 0, 0, 0], [0, 0, 0, 0, 3]], [[1, 0, 0, 0, 0], [1, 0, 1, 0, 1]], [0, 0],
           [[-R2, 0, 0, 0, 0], [R2, 0, 0, 0, 0]], credit="turn", gamma=1.0)
    # ... while a group of one keeps its raw returns (verl's group of one): 3, 3, 3
    _check("grpo", [[0, 0, 0, 0, 3]], [[1, 0, 1, 0, 1]], [0], [[3 / (1 + 1e-6), 0, 3 / (1 + 1e-6), 0, 3 / (1 + 1e-6)]],
           credit="turn", gamma=1.0)


def test_rloo_by_hand():
    # group 0 scores 1, 2 (on padding: counts), 6: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5,
    # 6 - (1+2)/2 = 4.5; row 3 alone in group 1: baseline 0 -> 2.
    mask, rewards = [[1, 1], [1, 0], [1, 1], [0, 1]], [[1, 0], [0, 2], [3, 3], [0, 2]]
    _check("rloo", rewards, mask, [0, 0, 0, 1], [[-3, -3], [-1.5, 0], [4.5, 4.5], [0, 2]], credit="token")
    # turn credit: each turn minus the other row's same turn: row 0 2 - 1, 2 - 0; row 1 1 - 2, 0 - 2
    _check("rloo", PAIR_REWARDS, PAIR_MASK, [0, 0], [[0, 1, 0, 2], [0, -1, 0, -2]], credit="turn", gamma=0.5)


def test_reinforce_plus_plus_by_hand():
    # gamma 0.5, reward 1 on the last generated id (the 5 on padding is ignored):
    # returns [0.25, 0.5, 1], mean 0.58333, unbiased var 0.14583 -> whitened below
    _check("reinforce_plus_plus", [[0, 0, 0, 1, 5]], [[0, 1, 1, 1, 0]], [0],
           [[0, -0.87287, -0.21822, 1.09109, 0]], ret=[[0, 0.25, 0.5, 1, 0]], credit="token", gamma=0.5)
    # outcome credit moves the sum 1 + 2 + 1 = 4 onto id 4; per-id returns 4, 2 (id 2), 1 (id 1)
    # -> [1, 2, 4]: mean 7/3, var 7/3 -> the same whitened numbers as above
    _check("reinforce_plus_plus", [[0, 1, 0, 2, 0, 1]], [[0, 1, 1, 0, 1, 0]], [0],
           [[0, -0.87287, -0.21822, 0, 1.09109, 0]], ret=[[0, 1, 2, 0, 4, 0]], credit="outcome", gamma=0.5)
    # turn credit, gamma 0.5 per turn: reward 1 on the observation after turn 1, 4 after turn 2
    # -> G2 = 4, G1 = 1 + 0.5*4 = 3; ids [3, 3, 4]: mean 3.333, var 1/3 -> -0.57735, -0.57735, 1.1547
    _check("reinforce_plus_plus", [[0, 0, 0, 1, 0, 4]], [[0, 1, 1, 0, 1, 0]], [0],
           [[0, -0.57735, -0.57735, 0, 1.1547, 0]], ret=[[0, 3, 3, 0, 4, 0]], credit="turn", gamma=0.5)


def test_reinforce_plus_plus_baseline_by_hand():
    # scores 1 and 3, group mean 2 -> centered -1 (two ids), +1 (one id); whiten [-1, -1, 1]:
    # mean -1/3, var 4/3 -> -0.57735, -0.57735, 1.1547
    _check("reinforce_plus_plus_baseline", [[1, 0, 0], [0, 3, 0]], [[1, 1, 0], [1, 0, 0]], [0, 0],
           [[-0.57735, -0.57735, 0], [1.1547, 0, 0]], credit="token")
    # turn credit: turn 1 mean 1.5, turn 2 mean 1 -> centered [0.5, 1, -0.5, -1] (one id each):
    # mean 0, unbiased var 2.5/3 -> divided by 0.91287
    _check("reinforce_plus_plus_baseline", PAIR_REWARDS, PAIR_MASK, [0, 0],
           [[0, 0.54772, 0, 1.09545], [0, -0.54772, 0, -1.09545]], credit="turn", gamma=0.5)


def test_gae_by_hand():
    # gamma = lam = 0.5, values 1, 2, 3 on ids 1..3, reward 1 at id 3:
    #   t=3: delta = 1 - 3 = -2                A = -2
    #   t=2: delta = 0.5*3 - 2 = -0.5          A = -0.5 + 0.25*(-2) = -1
    #   t=1: delta = 0.5*2 - 1 = 0             A = 0 + 0.25*(-1) = -0.25
    # returns A + V = [0.75, 1, 1]; whiten [-0.25, -1, -2]: mean -1.0833, var 0.77083
    _check("gae", [[0, 0, 0, 1]], [[0, 1, 1, 1]], [0], [[0, 0.94916, 0.09492, -1.04407]],
           ret=[[0, 0.75, 1, 1]], values=[[9, 1, 2, 3]], credit="token", gamma=0.5, lam=0.5)
    # transparency, gamma = lam = 1: id 1 bootstraps from id 3's value 2 (not the masked 5) and
    # the 7 on the masked id is ignored: A3 = 1 - 2 = -1, A1 = (2 - 1) + (-1) = 0; returns 1, 1
    _check("gae", [[0, 0, 7, 1]], [[0, 1, 0, 1]], [0], [[0, R2, 0, -R2]], ret=[[0, 1, 0, 1]],
           values=[[0, 1, 5, 2]], credit="token")
    # turn credit, gamma = lam = 0.5: V1 = 1 (first id of turn 1), V2 = 2; r1 = 1 (observation),
    # r2 = 3: A2 = 3 - 2 = 1, A1 = 1 + 0.5*2 - 1 + 0.25*1 = 1.25; returns 2.25, 2.25, 3;
    # whiten [1.25, 1.25, 1]: mean 1.1667, var 0.020833 -> 0.57735, 0.57735, -1.1547
    _check("gae", [[0, 0, 0, 1, 3]], [[0, 1, 1, 0, 1]], [0], [[0, 0.57735, 0.57735, 0, -1.1547]],
           ret=[[0, 2.25, 2.25, 0, 3]], values=[[0, 1, 9, 9, 2]], credit="turn", gamma=0.5, lam=0.5)


def test_gigpo_by_hand():
    # two turns per row; both rows start turn 1 from state 0, turn 2 from distinct states.
    # G (gamma 1): row 0 [1, 1], row 1 [0, 0]. Episode GRPO on 1 vs 0: +-1/sqrt(2).
    # Step: state 0 compares 1 vs 0 -> +-1/sqrt(2); states 1 and 2 are alone -> 0.
    _check("gigpo", [[0, 0, 1], [0, 0, 0]], [[1, 0, 1], [1, 0, 1]], [0, 0],
           [[2 * R2, 0, R2], [-2 * R2, 0, -R2]], state_ids=[[0, -1, 1], [0, -1, 2]], credit="turn")


# ---------------------------------------------------------------------------- (b) properties
# Dyadic rewards, values, gamma and lam keep float32 arithmetic exact on these sizes, so a
# constant batch (whitening multiplies rounding noise by 1/sqrt(1e-8) = 1e4) cannot flake.
REWARDS = [-1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 2.0]
VALUES = [i / 4 for i in range(-4, 5)]


@st.composite
def batches(draw, min_group=1, single_turn=False):
    """(rewards, mask, index, values): prompt zeros, runs of 1s with gaps, trailing padding."""
    width = draw(st.integers(2, 8))
    sizes = draw(st.lists(st.integers(min_group, 3), min_size=1, max_size=3))
    index = draw(st.permutations([g for g, n in enumerate(sizes) for _ in range(n)]))
    mask = []
    for _ in index:
        prompt = draw(st.integers(0, width - 1))
        if single_turn:  # prompt, response (possibly empty), padding
            n = draw(st.integers(0, width - prompt))
            mask.append([0.0] * prompt + [1.0] * n + [0.0] * (width - prompt - n))
        else:  # at least one generated id; the rest random: several turns, gaps, padding
            rest = draw(st.lists(st.booleans(), min_size=width - prompt - 1, max_size=width - prompt - 1))
            mask.append([0.0] * prompt + [1.0] + [float(b) for b in rest])
    anywhere = single_turn or draw(st.booleans())  # rewards also on masked ids?
    rewards = [[draw(st.sampled_from(REWARDS)) if m or anywhere else 0.0 for m in row] for row in mask]
    values = [[draw(st.sampled_from(VALUES)) for _ in row] for row in mask]
    return _t(rewards), _t(mask), torch.tensor(index), _t(values)


def configs(credit):
    return st.builds(AlgorithmConfig, credit=st.just(credit), gamma=st.sampled_from([1.0, 0.5]),
                     lam=st.sampled_from([1.0, 0.5]), norm_adv_by_std_in_grpo=st.booleans())


@pytest.mark.parametrize("credit", ["token", "turn", "outcome"])
@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_vectorised_matches_reference(name, credit, data):
    rewards, mask, index, values = data.draw(batches())
    config = data.draw(configs(credit))
    adv, ret = compute_advantages(name, EstimatorInput(rewards, mask, index, values, config))
    ref_adv, ref_ret = reference.reference_advantages(name, EstimatorInput(rewards, mask, index, values, config))
    torch.testing.assert_close(adv, ref_adv, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-5, rtol=0)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


@SETTINGS
@given(batch=batches(min_group=2), norm=st.booleans())
def test_grpo_advantages_sum_to_zero_in_each_group(batch, norm):
    rewards, mask, index, _ = batch
    config = AlgorithmConfig(credit="outcome", norm_adv_by_std_in_grpo=norm)
    adv, _ = compute_advantages("grpo", EstimatorInput(rewards, mask, index, None, config))
    per_seq = adv[torch.arange(len(index)), mask.argmax(dim=1)]  # every row has a generated id
    assert torch.equal(adv, per_seq[:, None] * mask)  # one scalar per sequence
    for group in index.unique():
        assert abs(float(per_seq[index == group].sum())) < 1e-4
    scores = rewards.sum(dim=1)  # the scalar orders sequences like their scores within a group
    for i in range(len(index)):
        for j in range(len(index)):
            if index[i] == index[j] and scores[i] > scores[j]:
                assert per_seq[i] > per_seq[j]


# ---------------------------------------------------------------------------- (c) verl
def _verl_whiten(values, mask):
    mean = (values * mask).sum() / (mask.sum() + 1e-8)
    n = mask.sum()
    var = ((values - mean) ** 2 * mask).sum() / (mask.sum() + 1e-8) * n / (n - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _verl_gae(rewards, mask, values, gamma, lam):
    next_values, last, reversed_adv = 0.0, 0.0, []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_ = delta + gamma * lam * last
        next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
        last = last_ * mask[:, t] + (1 - mask[:, t]) * last
        reversed_adv.append(last)
    adv = torch.stack(reversed_adv[::-1], dim=1)
    return _verl_whiten(adv, mask), adv + values


def _verl_group_means(scores, index):
    by_group = defaultdict(list)
    for i in range(len(scores)):
        by_group[int(index[i])].append(scores[i])
    stats = {}
    for g, s in by_group.items():
        if len(s) == 1:
            stats[g] = (torch.tensor(0.0), torch.tensor(1.0), 1)
        else:
            stats[g] = (torch.mean(torch.stack(s)), torch.std(torch.stack(s)), len(s))
    return stats


def _verl_grpo(rewards, mask, index, norm):
    scores, stats = rewards.sum(dim=-1), _verl_group_means(rewards.sum(dim=-1), index)
    out = []
    for i in range(len(scores)):
        mean, std, _ = stats[int(index[i])]
        out.append((scores[i] - mean) / (std + 1e-6) if norm else scores[i] - mean)
    adv = torch.stack(out)[:, None] * mask
    return adv, adv


def _verl_rloo(rewards, mask, index):
    scores, stats = rewards.sum(dim=-1), _verl_group_means(rewards.sum(dim=-1), index)
    out = []
    for i in range(len(scores)):
        mean, _, n = stats[int(index[i])]
        out.append(scores[i] * n / (n - 1) - mean * n / (n - 1) if n > 1 else scores[i])
    adv = torch.stack(out)[:, None] * mask
    return adv, adv


def _verl_rfpp(rewards, mask, gamma):
    returns, running = torch.zeros_like(rewards), torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]  # verl restarts at every masked id
    return _verl_whiten(returns, mask) * mask, returns


def _verl_rfpp_baseline(rewards, mask, index):
    scores, stats = rewards.sum(dim=-1), _verl_group_means(rewards.sum(dim=-1), index)
    centered = torch.stack([scores[i] - stats[int(index[i])][0] for i in range(len(scores))])
    tiled = centered[:, None].tile([1, rewards.shape[1]]) * mask
    adv = _verl_whiten(tiled, mask) * mask
    return adv, adv


VERL = {
    "grpo": lambda r, m, i, v, c: _verl_grpo(r, m, i, c.norm_adv_by_std_in_grpo),
    "rloo": lambda r, m, i, v, c: _verl_rloo(r, m, i),
    "reinforce_plus_plus": lambda r, m, i, v, c: _verl_rfpp(r, m, c.gamma),
    "reinforce_plus_plus_baseline": lambda r, m, i, v, c: _verl_rfpp_baseline(r, m, i),
    "gae": lambda r, m, i, v, c: _verl_gae(r, m, v, c.gamma, c.lam),
}


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(batch=batches(single_turn=True), config=configs("token"))
def test_matches_verl_on_single_turn_masks(name, batch, config):
    rewards, mask, index, values = batch  # rewards anywhere, padding and prompt included
    assume(mask.sum() >= 2)
    got = compute_advantages(name, EstimatorInput(rewards, mask, index, values, config))
    want = VERL[name](rewards, mask, index, values, config)
    on = mask > 0
    torch.testing.assert_close(got[0][on], want[0][on], atol=1e-5, rtol=0)  # advantages
    torch.testing.assert_close(got[1][on], want[1][on], atol=1e-5, rtol=0)  # returns


# ---------------------------------------------------------------------------- (d) transparency
def test_outcome_reward_reaches_earlier_turns_unlike_verl():
    # turn 1 = ids 1-2, observation 3-4, turn 2 = ids 5-6; outcome reward 1 at the end of turn 2
    mask, rewards = _t([[0, 1, 1, 0, 0, 1, 1, 0]]), _t([[0, 0, 0, 0, 0, 0, 1, 0]])
    config = AlgorithmConfig(credit="token", gamma=1.0)
    adv, ret = compute_advantages("reinforce_plus_plus",
                                  EstimatorInput(rewards, mask, torch.tensor([0]), None, config))
    verl_adv, verl_ret = _verl_rfpp(rewards, mask, 1.0)
    assert ret[0].tolist() == [0, 1, 1, 0, 0, 1, 1, 0]  # ours: turn 1 is credited with the outcome
    assert verl_ret[0, [1, 2, 5, 6]].tolist() == [0, 0, 1, 1]  # verl: restarted at the observation
    # whitened: ours is constant over the ids -> 0; verl's [0, 0, 1, 1] -> -+0.86603
    assert torch.all(adv == 0)
    torch.testing.assert_close(verl_adv[0, [1, 2, 5, 6]], _t([-0.86603, -0.86603, 0.86603, 0.86603]),
                               atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------- group of one
# Two single-turn episodes, each alone in its group, rewards 1 and 3. Spec: a group of one keeps
# its raw score: GRPO -> 1, 3 (divided by 1 + 1e-6); REINFORCE++-baseline -> whiten [1, 1, 3, 3]
# (mean 2, var 4/3) -> -+0.86603. With one turn per episode, turn credit has the same scores.
LONE = (_t([[0, 1], [0, 3]]), _t([[1, 1], [1, 1]]), torch.tensor([0, 1]), None)
LONE_EXPECTED = {"grpo": [[1, 1], [3, 3]], "reinforce_plus_plus_baseline": [[-0.86603] * 2, [0.86603] * 2]}


@pytest.mark.parametrize("credit", ["token", "outcome", "turn"])
@pytest.mark.parametrize("name", sorted(LONE_EXPECTED))
def test_group_of_one_keeps_raw_score(name, credit):
    config = AlgorithmConfig(credit=credit)
    adv, _ = compute_advantages(name, EstimatorInput(*LONE, config))
    torch.testing.assert_close(adv, _t(LONE_EXPECTED[name]), atol=1e-5, rtol=0)
    if credit != "outcome":
        ref, _ = reference.reference_advantages(name, EstimatorInput(*LONE, config))
        torch.testing.assert_close(ref, _t(LONE_EXPECTED[name]), atol=1e-5, rtol=0)


def test_turn_credit_group_of_one_multi_turn_is_not_its_own_baseline():
    # one episode alone in its group, two turns with rewards 0.5 and 1: raw turn returns 1.5, 1
    rewards, mask = _t([[0, 0.5, 0, 0, 1]]), _t([[0, 1, 0, 1, 1]])
    adv, _ = compute_advantages("grpo", EstimatorInput(rewards, mask, torch.tensor([7]), None,
                                                       AlgorithmConfig(credit="turn", gamma=1.0)))
    torch.testing.assert_close(adv, _t([[0, 1.5, 0, 1, 1]]) / (1 + 1e-6), atol=1e-6, rtol=0)
