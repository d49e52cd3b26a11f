"""Advantage estimators: one registry, one signature.

Every estimator takes
    token_rewards  (B, T) float32  reward of each turn at that turn's last generated id, 0 elsewhere
    response_mask  (B, T) float32  1 on ids the policy generated, 0 on prompt/observations/padding
    index          (B,)   int64    group id of each sequence (episodes sharing an env seed)
    values         (B, T) float32 or None (critic values, for estimators that use one)
    config         AlgorithmConfig
and returns (advantages, returns), both (B, T) float32 and zero where response_mask is 0.
Masks are transparent: an observation between two turns neither gets advantage nor cuts
credit. The trainer calls `compute_advantages(name, ...)` and never special-cases a name.

GRPO (Shao et al. 2024, DeepSeekMath): the outcome score of a sequence is the sum of its
token rewards; its advantage is (score - group mean) / (group std + eps), broadcast to every
generated token. As in verl: the std is the unbiased one (torch.std), a group of one gets mean 0
and std 1, eps = 1e-6, and `norm_adv_by_std_in_grpo=false` gives Dr. GRPO (no division).
"""

from __future__ import annotations

import torch

from agentrl.config import AlgorithmConfig
from agentrl.registry import ESTIMATORS, register_estimator

EPS = 1e-6


def compute_advantages(
    name: str,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    values: torch.Tensor | None,
    config: AlgorithmConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator registered under `name`."""
    fn = ESTIMATORS.get(name)
    return fn(token_rewards, response_mask, index, values, config)


@register_estimator("grpo")
def grpo(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    values: torch.Tensor | None,
    config: AlgorithmConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative outcome advantages (B, T); returns equal advantages, as in verl."""
    scores = token_rewards.sum(dim=-1)
    groups, inverse, counts = torch.unique(index, return_inverse=True, return_counts=True)
    n = counts.to(scores.dtype)
    mean = torch.zeros(len(groups), dtype=scores.dtype).index_add_(0, inverse, scores) / n
    centered = scores - mean[inverse]
    sq = torch.zeros(len(groups), dtype=scores.dtype).index_add_(0, inverse, centered**2)
    std = torch.sqrt(sq / (n - 1).clamp(min=1))
    # verl: a group of one has mean 0 and std 1, so its advantage is its raw score.
    single = counts[inverse] == 1
    centered = torch.where(single, scores, centered)
    std_row = torch.where(single, torch.ones_like(scores), std[inverse])
    adv = centered / (std_row + EPS) if config.norm_adv_by_std_in_grpo else centered
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv
