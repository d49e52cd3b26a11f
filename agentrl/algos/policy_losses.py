"""Policy losses selectable by name, as verl selects them (`actor.policy_loss.loss_mode`).

Every loss is a `losses.PolicyLoss`: it reads one `losses.PolicyLossInput`,
    fn(x: PolicyLossInput) -> (loss, stats)
whose fields are (B, T) float32 tensors aligned with the token ids (`mask` 1 on generated ids), the
clip range and `loss_agg_mode`, the mini-batch's counts for `aggregate` (so micro-batches sum to the
mini-batch's loss), `weights` the detached off-policy weights (TIS / decoupled PPO) multiplying each
token's loss and `config` the PolicyLossConfig; stats are {pg_clipfrac, pg_clipfrac_lower, ppo_kl}
(scalars, detached). A user's loss is registered the same way (`register_policy_loss("name")` in
a module of `imports`) and named by `actor.policy_loss.loss_mode`.
`ratio` below is exp(logp - old_logp), the log clamped to [-20, 20] as verl.

- vanilla: PPO clip with dual-clip (`losses.ppo_policy_loss`), the default.
- gspo (Zheng et al. 2025, GSPO, arXiv 2507.18071; verl compute_policy_loss_gspo): one ratio per
  sequence, s_i = exp(mean_t log ratio), with token-level gradient
  log s_it = sg(log s_i) + logp_t - sg(logp_t) (clamped at 10), PPO-clipped with
  clip_ratio_low/high (the paper uses ~3e-4 / 4e-4) and always aggregated seq-mean-token-mean.
- cispo (MiniMax-M1, arXiv 2506.13585; verl compute_policy_loss_cispo):
  -sg(clip(ratio, 1 - low, 1 + high)) * A * logp: the IS weight is clipped, never the token, so
  every token keeps its gradient A * w * grad logp. Aggregated with `loss_agg_mode`.
- sapo (Gao et al. 2025, arXiv 2511.20347; verl compute_policy_loss_sapo):
  -(4 / tau) sigmoid(tau (ratio - 1)) * A with tau = tau_pos where A > 0 else tau_neg: a soft,
  smooth trust region (gradient A at ratio 1, decaying away from it); seq-mean-token-mean.
- gmpo / geo_mean (Zhao et al. 2025, arXiv 2507.20673; verl compute_policy_loss_geo_mean):
  per sequence -A_i * exp(mean_t clip_A(log ratio)): the geometric mean of the token ratios,
  each log ratio clipped to [-clip_ratio_low, clip_ratio_high] *in log space* on the side that
  limits the update (sign of A) as verl does (the paper uses 0.4); A_i is the sequence's mean
  advantage; the mean over sequences.
- gpg (Chu et al. 2025; verl compute_policy_loss_gpg): -A * logp, no ratio, no clipping.

Deviations from verl: dual-clip (clip_ratio_c) applies to vanilla only, as in verl. gmpo averages
over the sequences that have generated ids (the mini-batch's `num_seqs`), where verl's
torch.mean also counts fully masked rows; with `weights`, gmpo weighs each sequence by the
geometric mean of its tokens' weights, as verl does with its rollout IS weights.
"""

from __future__ import annotations

import torch

from agentrl.algos.estimator import takes_record
from agentrl.algos.losses import PolicyLoss, PolicyLossInput, Stats, aggregate, masked_mean, ppo_policy_loss
from agentrl.errors import ConfigError, RegistryError
from agentrl.registry import POLICY_LOSSES, register_policy_loss

register_policy_loss("vanilla", ppo_policy_loss)


def check_loss_mode(name: str) -> None:
    """Raise a one-line ConfigError unless `name` is a registered policy loss taking one record."""
    try:
        fn = POLICY_LOSSES.get(name)
    except RegistryError as e:
        raise ConfigError(f"actor.policy_loss.loss_mode: {e}") from None
    if not takes_record(fn):
        raise ConfigError(f"actor.policy_loss.loss_mode: policy loss {name!r} ({getattr(fn, '__qualname__', fn)}) "
                          "must take one argument, an agentrl.algos.losses.PolicyLossInput, and return "
                          "(loss, stats)")


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered under `name` (unknown names list the known ones)."""
    return POLICY_LOSSES.get(name)


def policy_loss(name: str, inputs: PolicyLossInput) -> tuple[torch.Tensor, Stats]:
    """Run the policy loss registered under `name` on `inputs`."""
    return get_policy_loss(name)(inputs)


def _log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - old_logprobs).clamp(-20.0, 20.0)


def _stats(clipfrac: torch.Tensor | None, clipfrac_lower: torch.Tensor | None, log_ratio: torch.Tensor,
           mask: torch.Tensor) -> Stats:
    zero = torch.zeros((), device=mask.device)
    return {"pg_clipfrac": zero if clipfrac is None else clipfrac.detach(),
            "pg_clipfrac_lower": zero if clipfrac_lower is None else clipfrac_lower.detach(),
            "ppo_kl": masked_mean(-log_ratio, mask).detach()}


def _weighted(losses: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return losses if weights is None else losses * weights.detach()


def _aggregate(losses: torch.Tensor, x: PolicyLossInput, mode: str) -> torch.Tensor:
    """`aggregate` with the record's mask and mini-batch counts."""
    return aggregate(losses, x.mask, mode, x.num_tokens, x.num_seqs, x.horizon)


@register_policy_loss("gspo")
def gspo_policy_loss(x: PolicyLossInput) -> tuple[torch.Tensor, Stats]:
    """GSPO: PPO clip on the sequence-level ratio exp(mean_t log ratio), seq-mean-token-mean."""
    log_ratio = x.logprobs - x.old_logprobs
    lengths = x.mask.sum(dim=-1).clamp(min=1.0)
    seq_log_ratio = (torch.where(x.mask > 0, log_ratio, torch.zeros_like(log_ratio)).sum(-1) / lengths)
    token_log_ratio = x.logprobs - x.logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(token_log_ratio.clamp(max=10.0))
    unclipped = -x.advantages * ratio
    clipped = -x.advantages * ratio.clamp(1.0 - x.clip_ratio_low, 1.0 + x.clip_ratio_high)
    losses = _weighted(torch.maximum(unclipped, clipped), x.weights)
    loss = _aggregate(losses, x, "seq-mean-token-mean")
    return loss, _stats(masked_mean((clipped > unclipped).float(), x.mask), None, log_ratio, x.mask)


@register_policy_loss("cispo")
def cispo_policy_loss(x: PolicyLossInput) -> tuple[torch.Tensor, Stats]:
    """CISPO: -sg(clip(ratio)) * A * logp; the weight is clipped, no token loses its gradient."""
    log_ratio = _log_ratio(x.logprobs, x.old_logprobs)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - x.clip_ratio_low, 1.0 + x.clip_ratio_high)
    losses = _weighted(-clipped.detach() * x.advantages * x.logprobs, x.weights)
    loss = _aggregate(losses, x, x.loss_agg_mode)
    return loss, _stats(masked_mean((ratio != clipped).float(), x.mask), None, log_ratio, x.mask)


@register_policy_loss("sapo")
def sapo_policy_loss(x: PolicyLossInput) -> tuple[torch.Tensor, Stats]:
    """SAPO: -(4 / tau) sigmoid(tau (ratio - 1)) * A, tau by the sign of A; seq-mean-token-mean."""
    tau_pos, tau_neg = (1.0, 1.05) if x.config is None else (x.config.tau_pos, x.config.tau_neg)
    log_ratio = _log_ratio(x.logprobs, x.old_logprobs)
    ratio = torch.exp(log_ratio)
    tau = torch.where(x.advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    losses = _weighted(-gate * x.advantages, x.weights)
    loss = _aggregate(losses, x, "seq-mean-token-mean")
    return loss, _stats(None, None, log_ratio, x.mask)


@register_policy_loss("gmpo")
def gmpo_policy_loss(x: PolicyLossInput) -> tuple[torch.Tensor, Stats]:
    """GMPO: per sequence -mean_t(A) * exp(mean_t clipped log ratio), averaged over sequences."""
    log_ratio = x.logprobs - x.old_logprobs
    sign = torch.sign(x.advantages)
    bounded = log_ratio.clamp(-x.clip_ratio_low, x.clip_ratio_high)
    # The bound only binds on the side that would enlarge the update (sign of A), as verl.
    used = sign * torch.minimum(sign * log_ratio, sign * bounded)
    on = x.mask > 0
    lengths = x.mask.sum(dim=-1)
    seq_ratio = torch.exp(torch.where(on, used, torch.zeros_like(used)).sum(-1) / (lengths + 1e-8))
    seq_adv = torch.where(on, x.advantages, torch.zeros_like(x.advantages)).sum(-1) / (lengths + 1e-8)
    losses = -seq_adv * seq_ratio
    if x.weights is not None:
        log_w = torch.where(on, torch.log(x.weights.detach() + 1e-10), torch.zeros_like(used))
        losses = losses * torch.exp(log_w.sum(-1) / (lengths + 1e-8))
    seqs = x.num_seqs if x.num_seqs is not None else (lengths > 0).sum().clamp(min=1)
    loss = torch.where(lengths > 0, losses, torch.zeros_like(losses)).sum() / seqs
    hit = (log_ratio != bounded).float()
    upper, lower = masked_mean(hit * (x.advantages > 0), x.mask), masked_mean(hit * (x.advantages < 0), x.mask)
    return loss, _stats(upper, lower, log_ratio, x.mask)


register_policy_loss("geo_mean", gmpo_policy_loss)  # verl's name for GMPO


@register_policy_loss("gpg")
def gpg_policy_loss(x: PolicyLossInput) -> tuple[torch.Tensor, Stats]:
    """GPG: the plain policy gradient -A * logp, aggregated with `loss_agg_mode`."""
    losses = _weighted(-x.advantages * x.logprobs, x.weights)
    loss = _aggregate(losses, x, x.loss_agg_mode)
    return loss, _stats(None, None, _log_ratio(x.logprobs, x.old_logprobs), x.mask)
