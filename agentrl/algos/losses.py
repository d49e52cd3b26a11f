"""Policy and value losses, loss aggregation, KL estimators and off-policy weights.

Shapes: every tensor argument is (B, T) float32, aligned with the token ids; `mask` is 1 on
generated ids. Aggregation happens over a whole mini-batch even when it is split into
micro-batches: `aggregate` takes the mini-batch's token count, sequence count and horizon, so
gradient accumulation never reweights tokens (verl instead averages per micro-batch and scales
by micro/mini batch size, which changes the weighting when micro-batches differ in length).

seq-mean-token-sum-norm is verl's agg_loss as verl computes it (verl PR #5366, 2026-02, which
made it parallelism-invariant): the mini-batch's summed masked token losses divided by `horizon`
(verl's loss_scale_factor; verl's default is the padded response length loss_mask.shape[-1], ours
the most tokens an episode can generate), with no division by the number of sequences, so the step
grows with the batch. verl's legacy dp_actor also divided each micro-batch's loss by the
micro-batch count; ours is its value at micro_batch_size = ppo_mini_batch_size whatever the split.
dr-grpo is the Dr. GRPO paper's formula (TRL's loss_type="dr_grpo"): the same divided by the number
of sequences, (1/G) sum_i sum_t loss / MAX_TOKENS, whose step does not grow with the batch.

PPO clipped surrogate (Schulman et al. 2017), asymmetric as in DAPO, dual-clip as in Ye et al.
2020, all as verl's compute_policy_loss:
    ratio = exp(clamp(logp - old_logp, -20, 20))
    l1 = max(-A ratio, -A clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))
    loss = min(l1, -A clip_ratio_c) where A < 0, else l1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from agentrl.config import PolicyLossConfig

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
             "dr-grpo")

Stats = dict[str, torch.Tensor]  # a policy loss's diagnostics: pg_clipfrac, pg_clipfrac_lower, ppo_kl


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyLossInput:
    """What every policy loss reads (`actor.policy_loss.loss_mode`, algos/policy_losses.py): one
    micro-batch's logprobs, advantages and mask, and the settings and counts to aggregate them."""

    logprobs: torch.Tensor  # (B, T) float32: the current policy's logprob of each token id (with gradient)
    old_logprobs: torch.Tensor  # (B, T) float32: the logprobs the ratio is taken against
    advantages: torch.Tensor  # (B, T) float32
    mask: torch.Tensor  # (B, T) float32: 1 on ids the policy generated
    clip_ratio_low: float = 0.2  # the ratio's clip range is [1 - low, 1 + high]
    clip_ratio_high: float = 0.2
    loss_agg_mode: str = "token-mean"  # one of AGG_MODES (some losses always use their own)
    # The mini-batch's token count, for `aggregate`: a micro-batch's loss is its share of the
    # mini-batch's (None: this batch's own)
    num_tokens: float | None = None
    clip_ratio_c: float | None = None  # dual-clip bound (> 1) for negative advantages (vanilla); None: off
    weights: torch.Tensor | None = None  # (B, T) detached off-policy weights multiplying each token's loss
    num_seqs: float | None = None  # the mini-batch's count of sequences with generated ids (None: this batch's)
    horizon: float | None = None  # the *-token-sum-norm modes' constant (None: the mask's last dimension)
    config: PolicyLossConfig | None = None  # the `actor.policy_loss` section (sapo's taus)

    def replace(self, **changes: Any) -> PolicyLossInput:
        """A copy with `changes` applied (the record is frozen)."""
        return dataclasses.replace(self, **changes)


# The one signature of every policy loss: the record in, (scalar loss, detached Stats) out.
PolicyLoss = Callable[[PolicyLossInput], tuple[torch.Tensor, Stats]]


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              num_tokens: float | None = None, num_seqs: float | None = None,
              horizon: float | None = None) -> torch.Tensor:
    """Reduce a (B, T) loss matrix to a scalar over masked tokens.

    token-mean: sum / tokens. seq-mean-token-sum: mean over sequences of each one's token sum.
    seq-mean-token-mean: mean over sequences of each one's token mean. seq-mean-token-sum-norm
    (verl's agg_loss): all token sums / `horizon`, a constant (verl's loss_scale_factor; default
    the mask's last dimension, as verl), no division by the number of sequences. dr-grpo (the
    Dr. GRPO paper, TRL's dr_grpo): the same, also divided by the number of sequences. Sequences
    without generated ids do not
    count. Counts default to this batch's own; pass the mini-batch's when this is one
    micro-batch of it.
    """
    masked = torch.where(mask > 0, loss, torch.zeros_like(loss))
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1.0)
        return masked.sum() / denom
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode '{mode}' is unknown; use one of {', '.join(AGG_MODES)}")
    lengths = mask.sum(dim=-1)
    seqs = num_seqs if num_seqs is not None else (lengths > 0).sum().clamp(min=1)
    seq_sums = masked.sum(dim=-1)
    if mode == "seq-mean-token-sum":
        return seq_sums.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (seq_sums / lengths.clamp(min=1.0)).sum() / seqs
    norm = horizon if horizon is not None else float(mask.shape[-1])
    if mode == "seq-mean-token-sum-norm":
        return seq_sums.sum() / norm
    return seq_sums.sum() / (seqs * norm)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` where `mask` is 1 (0 when the mask is empty)."""
    return torch.where(mask > 0, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1.0)


def ppo_policy_loss(x: PolicyLossInput) -> tuple[torch.Tensor, Stats]:
    """PPO clipped policy loss and its diagnostics (pg_clipfrac, pg_clipfrac_lower, ppo_kl); a `PolicyLoss`.

    `clip_ratio_c` (> 1) turns on dual-clip for negative advantages; `weights` (detached,
    (B, T)) multiply each token's loss: importance weights for off-policy samples. `config`
    (actor.policy_loss) is unused here.
    """
    advantages, mask = x.advantages, x.mask
    log_ratio = (x.logprobs - x.old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - x.clip_ratio_low, 1.0 + x.clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    clipfrac_lower = torch.zeros((), device=x.logprobs.device)
    if x.clip_ratio_c is not None:
        floor = -advantages * x.clip_ratio_c
        lower = (losses > floor) & (advantages < 0)
        clipfrac_lower = masked_mean(lower.float(), mask).detach()
        losses = torch.where(advantages < 0, torch.minimum(losses, floor), losses)
    if x.weights is not None:
        losses = losses * x.weights.detach()
    loss = aggregate(losses, mask, x.loss_agg_mode, x.num_tokens, x.num_seqs, x.horizon)
    stats = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask).detach(),
        "pg_clipfrac_lower": clipfrac_lower,
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               cliprange_value: float, loss_agg_mode: str = "token-mean", num_tokens: float | None = None,
               num_seqs: float | None = None, horizon: float | None = None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss 0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2) and vf_clipfrac (verl)."""
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    l1 = (values - returns) ** 2
    l2 = (clipped - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(l1, l2), mask, loss_agg_mode, num_tokens, num_seqs, horizon)
    return loss, {"vf_clipfrac": masked_mean((l2 > l1).float(), mask).detach()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over masked ids (nan when returns are constant)."""
    r = returns[mask > 0]
    if r.numel() < 2:
        return float("nan")
    var = r.var()
    return float("nan") if var == 0 else float(1.0 - (r - values[mask > 0]).var() / var)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate between the policy and a reference, (B, T).

    kl (k1): logp - ref; abs: |logp - ref|; mse (k2): 0.5 (logp - ref)^2;
    low_var_kl (k3, Schulman 2020): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]
    as verl does. All are 0 where the two policies agree.
    """
    diff = logprobs - ref_logprobs
    if kind == "kl":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    if kind == "low_var_kl":
        log_ratio = (-diff).clamp(-20.0, 20.0)
        return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"kl_loss_type '{kind}' is unknown; use kl, abs, mse or low_var_kl")


def behaviour_weights(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                      mode: str, cap: float | None) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token importance weights pi_prox / pi_behav correcting for off-policy samples, (B, T).

    tis (verl's truncated importance sampling): the weight clamped to at most `cap`.
    decoupled (AReaL's decoupled PPO): the weight as is; tokens whose weight exceeds `cap` are
    dropped (weight 0). The PPO ratio is then taken against the proximal policy.
    """
    w = torch.exp((proximal_logprobs - behaviour_logprobs).clamp(-20.0, 20.0))
    if mode == "tis":
        out = w.clamp(max=cap) if cap is not None else w
        capped = (w > cap) if cap is not None else torch.zeros_like(w, dtype=torch.bool)
    elif mode == "decoupled":
        capped = (w > cap) if cap is not None else torch.zeros_like(w, dtype=torch.bool)
        out = torch.where(capped, torch.zeros_like(w), w)
    else:
        raise ValueError(f"off-policy weight mode '{mode}' is unknown; use tis or decoupled")
    out = out * mask
    stats = {"is_weight_mean": float(masked_mean(w, mask)), "is_weight_max": float((w * mask).max()),
             "is_capped_frac": float(masked_mean(capped.float(), mask))}
    return out, stats
