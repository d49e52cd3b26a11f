"""actor.policy_loss.loss_mode: each loss by hand, against its loop reference, and by name.

Loop references (agentrl.algos.reference_losses) give the loss and its analytic gradient per
token's logprob; the vectorised losses must match both (autograd), micro-batches included.
"""

import math

import pytest
import torch

from agentrl.algos import reference_losses as ref
from agentrl.algos.losses import PolicyLossInput, ppo_policy_loss
from agentrl.algos.policy_losses import policy_loss
from agentrl.config import PolicyLossConfig, load_config
from agentrl.errors import ConfigError
from agentrl.registry import POLICY_LOSSES


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def _run(name, logp, old, adv, mask, **kw):
    logp = _t(logp).requires_grad_(True)
    loss, stats = policy_loss(name, PolicyLossInput(logp, _t(old), _t(adv), _t(mask), **kw))
    loss.backward()
    return loss.item(), logp.grad, stats


# ------------------------------------------------------------------ by hand
def test_cispo_clips_the_weight_but_keeps_every_token_gradient():
    # token 0: ratio e^0.5 = 1.65 -> weight clipped to 1.2, A = 1, logp = 0;
    # token 1: ratio 1 -> weight 1, A = -2, logp = -1.  token-mean over 2 tokens:
    # loss = (-1.2 * 1 * 0 + -1 * -2 * -1) / 2 = -1;  d/dlogp = -w A / 2 = [-0.6, 1.0]
    loss, grad, stats = _run("cispo", [[0.0, -1.0]], [[-0.5, -1.0]], [[1.0, -2.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(-1.0)
    torch.testing.assert_close(grad, _t([[-0.6, 1.0]]))
    assert float(stats["pg_clipfrac"]) == 0.5
    # vanilla PPO drops the clipped token's gradient entirely; CISPO does not
    logp = _t([[0.0, -1.0]]).requires_grad_(True)
    ppo_policy_loss(PolicyLossInput(logp, _t([[-0.5, -1.0]]), _t([[1.0, -2.0]]), _t([[1.0, 1.0]])))[0].backward()
    assert float(logp.grad[0, 0]) == 0.0


def test_sapo_gate_at_ratio_one():
    # ratio 1: gate = (4 / tau) * sigmoid(0) = 2 / tau; tau_pos = 1 for A = 1, tau_neg = 1.05 for A = -1
    # losses [-2, 2 / 1.05], seq-mean-token-mean of one row; gradient -4 * 0.25 * A / 2 = -A / 2
    loss, grad, _ = _run("sapo", [[-1.0, -1.0]], [[-1.0, -1.0]], [[1.0, -1.0]], [[1.0, 1.0]],
                         config=PolicyLossConfig(tau_pos=1.0, tau_neg=1.05))
    assert loss == pytest.approx((-2.0 + 2.0 / 1.05) / 2, rel=1e-5)
    torch.testing.assert_close(grad, _t([[-0.5, 0.5]]))


def test_gspo_clips_the_sequence_ratio():
    # log ratios 0.1 and 0.3 -> sequence ratio exp(0.2) = 1.2214 > 1 + 0.2: clipped to 1.2, A = 1
    loss, grad, stats = _run("gspo", [[0.1, 0.3]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(-1.2)
    assert torch.all(grad == 0) and float(stats["pg_clipfrac"]) == 1.0
    # within a wider range: loss -exp(0.2), each token's gradient -exp(0.2) / 2 (its own logprob)
    loss, grad, _ = _run("gspo", [[0.1, 0.3]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]], clip_ratio_high=0.3)
    assert loss == pytest.approx(-math.exp(0.2), rel=1e-6)
    torch.testing.assert_close(grad, _t([[-math.exp(0.2) / 2] * 2]))


def test_gmpo_geometric_mean_with_log_space_clip():
    # A = 1: log ratios [0.1, 0.5] clipped above at 0.2 -> exp((0.1 + 0.2) / 2); the clipped token
    # gets no gradient. A = -1: the upper bound does not bind -> exp((0.1 + 0.5) / 2).
    loss, grad, stats = _run("gmpo", [[0.1, 0.5]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(-math.exp(0.15), rel=1e-6)
    torch.testing.assert_close(grad, _t([[-math.exp(0.15) / 2, 0.0]]))
    assert float(stats["pg_clipfrac"]) == 0.5 and float(stats["pg_clipfrac_lower"]) == 0.0
    loss, _, _ = _run("geo_mean", [[0.1, 0.5]], [[0.0, 0.0]], [[-1.0, -1.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(math.exp(0.3), rel=1e-6)


def test_gpg_is_the_plain_policy_gradient():
    loss, grad, _ = _run("gpg", [[-1.0, -2.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(1.5)
    torch.testing.assert_close(grad, _t([[-0.5, -0.5]]))


def test_vanilla_is_todays_ppo_loss():
    assert POLICY_LOSSES.get("vanilla") is ppo_policy_loss
    assert PolicyLossConfig().loss_mode == "vanilla"


# ------------------------------------------------------------------ against the loop reference
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
         "dr-grpo"]


def _random(seed):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, 6, generator=g) * 2
    old = logp + (torch.rand(4, 6, generator=g) - 0.5) * 0.8
    adv = torch.randn(4, 1, generator=g).expand(4, 6) + 0.1 * torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    mask[3] = 0.0  # a row without generated ids
    return logp, old, adv, mask


def _reference(name, logp, old, adv, mask, mode):
    args = (logp.tolist(), old.tolist(), adv.tolist(), mask.tolist())
    if name == "cispo":
        return ref.cispo(*args, 0.2, 0.28, mode, 6.0)
    if name == "gpg":
        return ref.gpg(*args, mode, 6.0)
    if name == "sapo":
        return ref.sapo(*args, 1.0, 1.05)
    if name == "gspo":
        return ref.gspo(*args, 0.2, 0.28)
    return ref.gmpo(*args, 0.2, 0.28)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["cispo", "gpg", "sapo", "gspo", "gmpo"])
def test_vectorised_matches_reference_loss_and_gradient(name, mode, seed):
    logp, old, adv, mask = _random(seed)
    want_loss, want_grad = _reference(name, logp, old, adv, mask, mode)
    x = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(name, PolicyLossInput(x, old, adv, mask, 0.2, 0.28, mode, horizon=6.0,
                                                config=PolicyLossConfig()))
    loss.backward()
    assert loss.item() == pytest.approx(want_loss, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(x.grad, _t(want_grad), atol=1e-6, rtol=1e-5)
    # micro-batches given the mini-batch's counts add up to the whole
    counts = {"num_tokens": float(mask.sum()), "num_seqs": float((mask.sum(-1) > 0).sum()), "horizon": 6.0}
    parts = sum(float(policy_loss(name, PolicyLossInput(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2],
                                                        0.2, 0.28, mode, config=PolicyLossConfig(), **counts))[0])
                for i in (0, 2))
    assert parts == pytest.approx(want_loss, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", ["vanilla", "cispo", "gpg", "sapo", "gspo", "gmpo"])
def test_masked_tokens_get_no_gradient(name):
    logp, old, adv, mask = _random(7)
    x = logp.clone().requires_grad_(True)
    policy_loss(name, PolicyLossInput(x, old, adv, mask, config=PolicyLossConfig()))[0].backward()
    assert torch.all(x.grad[mask == 0] == 0.0) and torch.isfinite(x.grad).all()


# ------------------------------------------------------------------ selection by name
def test_loss_mode_is_checked_when_the_config_loads():
    assert load_config(None, ["actor.policy_loss.loss_mode=gspo"]).actor.policy_loss.loss_mode == "gspo"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["actor.policy_loss.loss_mode=gsop"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("actor.policy_loss.loss_mode")
    assert "Did you mean 'gspo'?" in msg and "cispo" in msg and "vanilla" in msg
    with pytest.raises(ConfigError, match="tau_pos"):
        load_config(None, ["actor.policy_loss.loss_mode=sapo", "actor.policy_loss.tau_pos=0"])


def test_builtin_names_known_to_the_config_are_the_registered_ones():
    from agentrl.config import BUILTIN_POLICY_LOSSES

    assert sorted(BUILTIN_POLICY_LOSSES) == POLICY_LOSSES.names()


def test_a_bad_loss_mode_fails_before_torch_is_imported():
    import subprocess
    import sys

    code = ("import sys\nfrom agentrl.config import load_config\nfrom agentrl.errors import ConfigError\n"
            "try:\n    load_config(None, ['actor.policy_loss.loss_mode=gsop'])\nexcept ConfigError as e:\n"
            "    print(e)\nprint('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.splitlines()
    assert out[0].startswith("actor.policy_loss.loss_mode: unknown") and out[1] == "False"


def test_cli_names_the_unknown_loss_mode_in_one_line(tmp_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "actor.policy_loss.loss_mode=ppo2"],
                         capture_output=True, text=True, cwd=tmp_path)  # not the checkout: its runs/ may hold a run
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "actor.policy_loss.loss_mode" in res.stderr


def test_every_policy_loss_takes_the_one_record():
    """Each registered loss takes one parameter, a PolicyLossInput."""
    import inspect

    for name in POLICY_LOSSES.names():
        params = list(inspect.signature(POLICY_LOSSES.get(name)).parameters.values())
        assert len(params) == 1 and params[0].annotation in (PolicyLossInput, "PolicyLossInput"), name


def test_a_registered_loss_gets_the_record(registries_restored):
    from agentrl.algos.policy_losses import check_loss_mode
    from agentrl.registry import register_policy_loss

    seen = []

    @register_policy_loss("test_halved_vanilla")
    def halved(x):
        seen.append(x)
        loss, stats = ppo_policy_loss(x)
        return loss * 0.5, stats

    check_loss_mode("test_halved_vanilla")
    logp, old, adv, mask = _random(3)
    inputs = PolicyLossInput(logp, old, adv, mask, 0.2, 0.28, "seq-mean-token-mean", config=PolicyLossConfig())
    loss, _ = policy_loss("test_halved_vanilla", inputs)
    assert seen == [inputs] and torch.equal(loss, ppo_policy_loss(inputs)[0] * 0.5)


def test_a_loss_in_the_earlier_many_parameter_form_is_refused_in_one_line(registries_restored):
    from agentrl.algos.policy_losses import check_loss_mode
    from agentrl.registry import register_policy_loss

    @register_policy_loss("test_positional_loss")
    def positional(logprobs, old_logprobs, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.2,
                   loss_agg_mode="token-mean", num_tokens=None, clip_ratio_c=None, weights=None, num_seqs=None,
                   horizon=None, config=None):
        return ppo_policy_loss(PolicyLossInput(logprobs, old_logprobs, advantages, mask))

    with pytest.raises(ConfigError) as e:
        check_loss_mode("test_positional_loss")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("actor.policy_loss.loss_mode: policy loss 'test_positional_loss'")
    assert "PolicyLossInput" in msg
