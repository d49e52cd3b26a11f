"""Is turn credit biased when the policy controls the episode's length? Exact answers, no sampling.

On the wait-or-go game (agentrl/algos/wait_gradient.py, the tabular form of the `wait_walk` env)
waiting changes nothing the policy can earn, so the true gradient's wait component is 0. Each test
enumerates every group of episodes and computes the expected update of the real estimator under
the real loss aggregation (float32 advantages: equal to 1e-6; the biases found are 1e-2).
"""

import pytest
import torch

from agentrl.algos.wait_gradient import WAIT, expected_update, true_gradient, wait_bias
from agentrl.config import AlgorithmConfig

WAITING = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)  # waits 42% of the time, prefers the goal


def test_waiting_changes_nothing_the_policy_can_earn():
    for logits in ([0.0, 0.0, 0.0], [2.0, 0.5, -1.0]):
        grad = true_gradient(torch.tensor(logits, dtype=torch.float64), horizon=3)
        assert abs(float(grad[WAIT])) < 1e-12 and float(grad[1]) > 0


def test_rloo_expects_the_true_gradient():
    """A baseline made of the other episodes only is unbiased (outcome credit: exactly the gradient)."""
    update = expected_update(AlgorithmConfig(adv_estimator="rloo", credit="outcome"), WAITING)
    torch.testing.assert_close(update, true_gradient(WAITING, horizon=3), atol=1e-6, rtol=0)


def test_turn_rloo_points_along_the_true_gradient():
    """Turn k against turn k of the group's other episodes: which of them reached turn k depends on
    their actions, never on this episode's, so the baseline adds no bias. A turn no other episode
    reached gets 0, which weighs turn k by the chance that another episode reached it: the
    expected update is the true gradient shortened (here to 0.85 of it), never turned."""
    update = expected_update(AlgorithmConfig(adv_estimator="rloo", credit="turn"), WAITING)
    true = true_gradient(WAITING, horizon=3)
    scale = float(update[1] / true[1])
    assert 0.8 < scale < 0.9
    torch.testing.assert_close(update, scale * true, atol=1e-6, rtol=0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("estimator,norm", [("grpo", True), ("grpo", False), ("rloo", True),
                                            ("reinforce_plus_plus_baseline", True)])
def test_turn_credit_does_not_teach_waiting_under_any_loss_normalisation(agg, estimator, norm):
    """Before the fix, a turn no other episode of its group reached kept its raw return; a loss
    divided by the batch's token count (token-mean, the default) then pushed the policy away from
    waiting: grpo -1.2%, Dr. GRPO -2.0%, rloo -1.5% of the goal's push."""
    config = AlgorithmConfig(adv_estimator=estimator, credit="turn", norm_adv_by_std_in_grpo=norm)
    assert wait_bias(config, WAITING, loss_agg_mode=agg) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("credit", ["outcome", "token"])
def test_episode_level_credit_does_not_teach_waiting(credit):
    config = AlgorithmConfig(adv_estimator="grpo", credit=credit)
    assert wait_bias(config, WAITING, loss_agg_mode="token-mean") == pytest.approx(0.0, abs=1e-6)


def test_gigpo_teaches_waiting_when_a_wait_revisits_its_state():
    """GiGPO's same-state groups pool an episode's own turns when a wait leaves the state as it was,
    and its std then depends on the episode: it pushes towards waiting. Without the std, or when
    every turn starts from a state of its own, it does not."""
    gigpo = AlgorithmConfig(adv_estimator="gigpo", credit="turn")
    assert wait_bias(gigpo, WAITING) > 0.01
    assert wait_bias(gigpo, WAITING, same_state=False) == pytest.approx(0.0, abs=1e-6)
    no_std = AlgorithmConfig(adv_estimator="gigpo", credit="turn", norm_adv_by_std_in_grpo=False)
    assert wait_bias(no_std, WAITING) == pytest.approx(0.0, abs=1e-6)
