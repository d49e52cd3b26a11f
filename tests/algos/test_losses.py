"""PPO clipped loss and token-mean aggregation on hand-computed cases."""

import pytest
import torch

from agentrl.algos.losses import PolicyLossInput, aggregate, ppo_policy_loss


def test_ratio_one_gives_minus_mean_advantage():
    adv = torch.tensor([[0.0, 1.0, 2.0], [0.0, -3.0, 0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    logp = torch.randn(2, 3)
    loss, stats = ppo_policy_loss(PolicyLossInput(logp, logp.clone(), adv, mask))
    assert float(loss) == pytest.approx(-(1.0 + 2.0 - 3.0) / 3)
    assert float(stats["pg_clipfrac"]) == 0.0 and float(stats["ppo_kl"]) == 0.0


def test_clipping_hand_computed():
    # ratio e^{0.5} = 1.6487 > 1.2: positive advantage is clipped at 1.2, negative is not.
    logp = torch.tensor([[0.5, 0.5]])
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, stats = ppo_policy_loss(PolicyLossInput(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2))
    r = torch.exp(torch.tensor(0.5)).item()
    assert float(loss) == pytest.approx((-1.2 + r) / 2, rel=1e-5)
    assert float(stats["pg_clipfrac"]) == pytest.approx(0.5)
    # asymmetric: clip-higher 0.28 lets the positive side reach 1.28
    loss_hi, _ = ppo_policy_loss(PolicyLossInput(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28))
    assert float(loss_hi) == pytest.approx((-1.28 + r) / 2, rel=1e-5)


def test_masked_tokens_get_zero_gradient():
    logp = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    loss, _ = ppo_policy_loss(PolicyLossInput(logp, logp.detach() + 0.1, torch.randn(2, 4), mask))
    loss.backward()
    assert torch.all(logp.grad[mask == 0] == 0)
    assert torch.all(logp.grad[mask == 1] != 0)


def test_token_mean_with_global_token_count():
    loss = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert float(aggregate(loss, mask)) == pytest.approx(8.0 / 3)
    assert float(aggregate(loss, mask, num_tokens=8.0)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(loss, mask, "seq-mean-token-max")


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
def test_kl_estimators_are_zero_when_policies_agree(kind):
    from agentrl.algos.losses import kl_penalty

    logp = torch.log(torch.rand(3, 5))
    assert torch.all(kl_penalty(logp, logp.clone(), kind) == 0)


def test_kl_estimators_hand_computed():
    from agentrl.algos.losses import kl_penalty

    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    assert float(kl_penalty(logp, ref, "kl")) == pytest.approx(1.0)
    assert float(kl_penalty(logp, ref, "abs")) == pytest.approx(1.0)
    assert float(kl_penalty(logp, ref, "mse")) == pytest.approx(0.5)
    # k3 = exp(ref - logp) - (ref - logp) - 1 = e^-1 + 1 - 1
    assert float(kl_penalty(logp, ref, "low_var_kl")) == pytest.approx(torch.exp(torch.tensor(-1.0)).item())
    assert float(kl_penalty(torch.tensor([[0.0]]), torch.tensor([[30.0]]), "low_var_kl")) == 10.0  # clamped
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(logp, ref, "k4")


# ------------------------------------------------------------------ aggregation modes
LOSS = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (1 + 2 + 3 + 4) / 4),                 # 10 / 4 tokens
    ("seq-mean-token-sum", (6 + 4) / 2),                 # mean of sequence sums
    ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),        # mean of sequence means
    ("seq-mean-token-sum-norm", (6 + 4) / 8.0),          # verl's agg_loss: all sums / horizon 8
    ("dr-grpo", (6 + 4) / (2 * 8.0)),                    # Dr. GRPO: / (seqs * horizon)
])
def test_aggregation_modes_hand_computed(mode, expected):
    assert float(aggregate(LOSS, MASK, mode, horizon=8.0)) == pytest.approx(expected)


def test_empty_sequences_do_not_count_in_seq_modes():
    loss = torch.cat([LOSS, torch.full((1, 4), 9.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    assert float(aggregate(loss, mask, "seq-mean-token-sum")) == pytest.approx(5.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm", "dr-grpo"])
def test_micro_batches_with_minibatch_counts_sum_to_the_whole(mode):
    whole = aggregate(LOSS, MASK, mode, horizon=8.0)
    counts = {"num_tokens": float(MASK.sum()), "num_seqs": 2.0, "horizon": 8.0}
    parts = sum(aggregate(LOSS[i:i + 1], MASK[i:i + 1], mode, **counts) for i in range(2))
    assert float(parts) == pytest.approx(float(whole))


def test_unknown_agg_mode_names_the_choices():
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        aggregate(LOSS, MASK, "mean")


# ------------------------------------------------------------------ dual clip, weights, gradients
def test_dual_clip_bounds_negative_advantage_loss():
    # ratio e^2 = 7.39 with A = -1: the ordinary clipped loss is 7.39; dual-clip caps it at 3.
    logp, old = torch.tensor([[2.0, 2.0]]), torch.zeros(1, 2)
    adv, mask = torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2)
    loss, stats = ppo_policy_loss(PolicyLossInput(logp, old, adv, mask, clip_ratio_c=3.0))
    assert float(loss) == pytest.approx((3.0 + -1.2) / 2, rel=1e-5)
    assert float(stats["pg_clipfrac_lower"]) == pytest.approx(0.5)
    loss_off, _ = ppo_policy_loss(PolicyLossInput(logp, old, adv, mask, clip_ratio_c=None))
    assert float(loss_off) == pytest.approx((torch.exp(torch.tensor(2.0)).item() - 1.2) / 2, rel=1e-5)


def test_weights_scale_each_token():
    logp = torch.zeros(1, 2)
    adv, mask = torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    loss, _ = ppo_policy_loss(PolicyLossInput(logp, logp, adv, mask, weights=torch.tensor([[2.0, 0.0]])))
    assert float(loss) == pytest.approx(-1.0)


def test_masked_tokens_get_exactly_zero_gradient():
    logp = torch.randn(2, 5, requires_grad=True)
    old = logp.detach() + torch.randn(2, 5)
    adv = torch.randn(2, 5)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0, 0.0]])
    for mode in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        logp.grad = None
        loss, _ = ppo_policy_loss(PolicyLossInput(logp, old, adv, mask, loss_agg_mode=mode, clip_ratio_c=3.0))
        loss.backward()
        assert torch.all(logp.grad[mask == 0] == 0.0)
        assert torch.any(logp.grad[mask == 1] != 0.0)


def test_value_loss_clipped_hand_computed():
    from agentrl.algos.losses import value_loss

    v, old, ret = torch.tensor([[2.0, 0.1]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    # token 1: v=2 clipped to 0.5 -> max((2-1)^2, (0.5-1)^2) = 1; token 2: within range, (0.1-1)^2 = 0.81
    loss, stats = value_loss(v, old, ret, mask, cliprange_value=0.5)
    assert float(loss) == pytest.approx(0.5 * (1.0 + 0.81) / 2)
    assert float(stats["vf_clipfrac"]) == 0.0
    # v = -1 clipped to -0.5: (-0.5-1)^2 = 2.25 > (-1-1)^2 = 4? no: 4 > 2.25, unclipped wins
    loss2, stats2 = value_loss(torch.tensor([[0.9]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]),
                               torch.ones(1, 1), cliprange_value=0.5)
    # clipped 0.5 -> (0.5-1)^2 = 0.25 > (0.9-1)^2 = 0.01: the clipped (pessimistic) term wins
    assert float(loss2) == pytest.approx(0.5 * 0.25) and float(stats2["vf_clipfrac"]) == 1.0


def test_explained_variance():
    from agentrl.algos.losses import explained_variance

    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4) + 2.5, ret, mask) == pytest.approx(0.0)


def test_behaviour_weights_tis_caps_and_decoupled_drops():
    from agentrl.algos.losses import behaviour_weights

    prox = torch.log(torch.tensor([[1.0, 3.0, 0.5]]))
    behav = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    tis, s = behaviour_weights(prox, behav, mask, "tis", 2.0)
    assert torch.allclose(tis, torch.tensor([[1.0, 2.0, 0.5]]))
    assert s["is_capped_frac"] == pytest.approx(1 / 3)
    dec, _ = behaviour_weights(prox, behav, mask, "decoupled", 2.0)
    assert torch.allclose(dec, torch.tensor([[1.0, 0.0, 0.5]]))


def test_kl_controller_adaptive_moves_towards_target():
    from agentrl.algos.kl_control import KLController
    from agentrl.config import KLControlConfig

    ctrl = KLController(KLControlConfig(type="adaptive", kl_coef=0.1, horizon=100, target_kl=0.1))
    ctrl.update(current_kl=1.0, n_steps=10)  # error clipped to +0.2 -> x(1 + 0.2 * 10/100)
    assert ctrl.value == pytest.approx(0.1 * 1.02)
    ctrl.update(current_kl=0.0, n_steps=10)  # error -0.2
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 0.98)
    fixed = KLController(KLControlConfig(type="fixed", kl_coef=0.1))
    fixed.update(5.0, 10)
    assert fixed.value == 0.1
