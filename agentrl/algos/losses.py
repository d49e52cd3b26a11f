"""Policy losses and loss aggregation.

PPO clipped surrogate (Schulman et al. 2017) with asymmetric clipping as in verl/DAPO:
    ratio = exp(logp - old_logp)                       (log-ratio clamped to [-20, 20] as verl does)
    loss  = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))
Shapes: every tensor argument is (B, T) float32, aligned with the token ids; `mask` is 1 on
generated ids. Aggregation `token-mean` divides the masked sum by `num_tokens` when given (the
token count of the whole mini-batch, so micro-batching does not reweight tokens: a deviation
from verl, which averages per micro-batch and rescales by micro/mini batch size).
"""

from __future__ import annotations

import torch


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              num_tokens: float | None = None) -> torch.Tensor:
    """Reduce a (B, T) loss matrix to a scalar over masked tokens."""
    if mode != "token-mean":
        raise ValueError(f"loss_agg_mode '{mode}' is not supported; use 'token-mean'")
    denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1.0)
    return (loss * mask).sum() / denom


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` where `mask` is 1 (0 when the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped policy loss and its diagnostics (pg_clipfrac, ppo_kl)."""
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    loss = aggregate(losses, mask, loss_agg_mode, num_tokens)
    stats = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return loss, stats


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
