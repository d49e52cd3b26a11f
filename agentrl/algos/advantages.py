"""Advantage estimators: one registry, one signature.

Every estimator takes
    token_rewards  (B, T) float32  reward of each turn at that turn's last generated id, 0 elsewhere
    response_mask  (B, T) float32  1 on ids the policy generated, 0 on prompt/observations/padding
    index          (B,)   int64    group id of each sequence (episodes sharing an env seed)
    values         (B, T) float32 or None (critic values, for estimators that use one)
    config         AlgorithmConfig
    state_ids      (B, T) int64 or None: id of the env state each generated token's turn started
                   from (unique per group), -1 elsewhere, for step-level baselines
and returns (advantages, returns), both (B, T) float32 and zero where response_mask is 0.
Masks are transparent: an observation between two turns neither gets advantage nor cuts
credit. The trainer calls `compute_advantages(name, ...)` and never special-cases a name.

GRPO (Shao et al. 2024, DeepSeekMath), `credit="outcome"`: the outcome score of a sequence is
the sum of its token rewards; its advantage is (score - group mean) / (group std + eps),
broadcast to every generated token. As in verl: the std is the unbiased one (torch.std), a group
of one gets mean 0 and std 1, eps = 1e-6, and `norm_adv_by_std_in_grpo=false` gives Dr. GRPO.

Turn-level GRPO, `credit="turn"` (our extension for multi-turn episodes): a turn's score is its
discounted return from that turn on, G_k = r_k + gamma * G_{k+1} (gamma per agent turn, not
per token); the baseline is the mean (and std) of every turn score in the group, and each
generated token gets its own turn's normalised score. A turn ends at its last generated id
(mask 1 followed by mask 0 or the end), which is where the rollout places the turn's reward.

GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization"): the episode-level GRPO advantage
plus `step_adv_weight` times a step-level one, where turns that start from the same env state
(anchor state) in one group are compared: (G_k - mean) / (std + eps) over that anchor group,
G_k the discounted turn return. Deviation: an anchor group of one turn gets step advantage 0.
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
    state_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator registered under `name`."""
    fn = ESTIMATORS.get(name)
    return fn(token_rewards, response_mask, index, values, config, state_ids)


@register_estimator("grpo")
def grpo(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    values: torch.Tensor | None,
    config: AlgorithmConfig,
    state_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages (B, T), per episode or per turn; returns equal advantages."""
    if config.credit == "turn":
        return _grpo_turns(token_rewards, response_mask, index, config)
    scores = token_rewards.sum(dim=-1)
    _, inverse = torch.unique(index, return_inverse=True)
    count, mean, std = group_stats(scores, inverse)
    centered = scores - mean[inverse]
    # verl: a group of one has mean 0 and std 1, so its advantage is its raw score.
    single = count[inverse] == 1
    centered = torch.where(single, scores, centered)
    std_row = torch.where(single, torch.ones_like(scores), std[inverse])
    adv = centered / (std_row + EPS) if config.norm_adv_by_std_in_grpo else centered
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def turn_ends(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the last generated id of each turn (mask 1 followed by 0 or the end)."""
    mask = response_mask > 0
    after = torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)
    return mask & ~after


def turn_ids(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: 1 + index of the agent turn each position belongs to (0 before the first).

    Positions after a turn's last generated id (observations) count for that turn, so a reward
    placed there is that turn's reward.
    """
    mask = response_mask > 0
    before = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    return (mask & ~before).long().cumsum(dim=1)


def turn_returns(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T): each generated token gets its turn's discounted return G_k = r_k + gamma G_{k+1}."""
    ids = turn_ids(response_mask)
    n_turns = int(ids.max()) if ids.numel() else 0
    per_turn = torch.zeros(ids.shape[0], n_turns + 1, dtype=token_rewards.dtype)
    per_turn.scatter_add_(1, ids, token_rewards)
    returns = torch.zeros_like(per_turn)
    running = torch.zeros(ids.shape[0], dtype=token_rewards.dtype)
    for k in range(n_turns, 0, -1):
        running = per_turn[:, k] + gamma * running
        returns[:, k] = running
    return returns.gather(1, ids) * response_mask


def _grpo_turns(token_rewards, response_mask, index, config):
    returns = turn_returns(token_rewards, response_mask, config.gamma)
    rows, cols = turn_ends(response_mask).nonzero(as_tuple=True)
    groups, inverse = torch.unique(index[rows], return_inverse=True)
    _, mean, std = group_stats(returns[rows, cols], inverse, len(groups))
    group_of_row = torch.zeros(index.shape[0], dtype=torch.long)
    group_of_row[rows] = inverse
    centered = returns - mean[group_of_row].unsqueeze(1)
    if config.norm_adv_by_std_in_grpo:
        centered = centered / (std[group_of_row].unsqueeze(1) + EPS)
    adv = centered * response_mask
    return adv, adv


def group_stats(values: torch.Tensor, ids: torch.Tensor, size: int | None = None):
    """Per-id count, mean and unbiased std of `values` (N,) with ids (N,) in [0, size)."""
    size = int(ids.max()) + 1 if size is None and ids.numel() else (size or 0)
    count = torch.zeros(size, dtype=values.dtype).index_add_(0, ids, torch.ones_like(values))
    mean = torch.zeros(size, dtype=values.dtype).index_add_(0, ids, values) / count.clamp(min=1)
    sq = torch.zeros(size, dtype=values.dtype).index_add_(0, ids, (values - mean[ids]) ** 2)
    return count, mean, torch.sqrt(sq / (count - 1).clamp(min=1))


@register_estimator("gigpo")
def gigpo(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    values: torch.Tensor | None,
    config: AlgorithmConfig,
    state_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Episode-level GRPO plus step-level advantages from anchor-state groups, (B, T)."""
    if state_ids is None:
        raise ValueError("gigpo needs state_ids (the env state each turn started from)")
    outcome = AlgorithmConfig(**{**config.__dict__, "credit": "outcome"})
    episode, _ = grpo(token_rewards, response_mask, index, None, outcome)
    returns = turn_returns(token_rewards, response_mask, config.gamma)
    ends = turn_ends(response_mask) & (state_ids >= 0)
    size = int(state_ids.max()) + 1 if state_ids.numel() else 0
    count, mean, std = group_stats(returns[ends], state_ids[ends], size)
    sid = state_ids.clamp(min=0)
    step = returns - mean[sid]
    if config.norm_adv_by_std_in_grpo:
        step = step / (std[sid] + EPS)
    step = torch.where((state_ids >= 0) & (count[sid] > 1), step, torch.zeros_like(step))
    adv = (config.episode_adv_weight * episode + config.step_adv_weight * step) * response_mask
    return adv, adv
