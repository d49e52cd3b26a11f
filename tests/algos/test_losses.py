"""PPO clipped loss and token-mean aggregation on hand-computed cases."""

import pytest
import torch

from agentrl.algos.losses import aggregate, ppo_policy_loss


def test_ratio_one_gives_minus_mean_advantage():
    adv = torch.tensor([[0.0, 1.0, 2.0], [0.0, -3.0, 0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    logp = torch.randn(2, 3)
    loss, stats = ppo_policy_loss(logp, logp.clone(), adv, mask)
    assert float(loss) == pytest.approx(-(1.0 + 2.0 - 3.0) / 3)
    assert float(stats["pg_clipfrac"]) == 0.0 and float(stats["ppo_kl"]) == 0.0


def test_clipping_hand_computed():
    # ratio e^{0.5} = 1.6487 > 1.2: positive advantage is clipped at 1.2, negative is not.
    logp = torch.tensor([[0.5, 0.5]])
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, stats = ppo_policy_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    r = torch.exp(torch.tensor(0.5)).item()
    assert float(loss) == pytest.approx((-1.2 + r) / 2, rel=1e-5)
    assert float(stats["pg_clipfrac"]) == pytest.approx(0.5)
    # asymmetric: clip-higher 0.28 lets the positive side reach 1.28
    loss_hi, _ = ppo_policy_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert float(loss_hi) == pytest.approx((-1.28 + r) / 2, rel=1e-5)


def test_masked_tokens_get_zero_gradient():
    logp = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    loss, _ = ppo_policy_loss(logp, logp.detach() + 0.1, torch.randn(2, 4), mask)
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
