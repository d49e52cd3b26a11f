"""Advantage estimators: one registry, one input record.

Every estimator reads one `EstimatorInput` (agentrl/algos/estimator.py: the batch's
`token_rewards`, `response_mask`, group `index`, critic `values`, the `config`, and for step-level
baselines `state_ids`) and returns (advantages, returns), both (B, T) float32 and zero where
response_mask is 0. The trainer calls `compute_advantages(name, inputs)` and never
special-cases a name. An estimator whose function has `greedy_baseline = True` (ReMax) makes the
run play one greedy episode per group, and reads `reward_baselines` (B,) float32: the reward of
its group's greedy episode.

## Credit (`config.credit`)
- `token`: verl's semantics exactly. Rewards stay where they are; recursions run over generated
  ids with gamma and lam per generated id; group estimators score a sequence by its reward sum.
- `outcome`: the trainer first moves each episode's summed reward onto its last generated id
  (`outcome_rewards`), then the estimator runs as under `token`.
- `turn`: our multi-turn extension. A turn's return is G_k = r_k + gamma * G_{k+1} (gamma per
  agent turn); group estimators compare G_k with the returns of turn k in the group's other
  episodes (same task, same turn number); GAE runs its TD recursion over turns (the value of
  turn k is the critic's value before its first id).

## Masks are transparent
An id with mask 0 (prompt, observations, feedback between turns, padding) neither receives
advantage nor breaks a recursion: GAE bootstraps from one generated id to the next generated
id, and discounted returns carry a later reward back to earlier turns. verl's REINFORCE++
restarts its running return at every masked position, so there an outcome reward never reaches
earlier turns; on single-turn masks (prompt, response, padding) the two agree exactly.

## Edge cases (one documented answer each)
- A group of one: GRPO uses mean 0 and std 1 (verl), RLOO and REINFORCE++-baseline use
  baseline 0 (verl), so the advantage is the raw score in all three; under turn credit every turn
  of a group of one keeps its raw return too. In a larger group, a turn number that only one
  episode reached has nothing to compare with and gets 0: an episode is never its own baseline,
  and a raw return there (the earlier rule) taught the policy to end episodes early under a
  token-count-normalised loss (`agentrl/algos/wait_gradient.py`, `benchmarks/turn_credit.py`).
- Whitening (GAE, REINFORCE++, REINFORCE++-baseline) uses the mean and unbiased variance of all
  generated ids in the batch (verl's masked_whiten); with fewer than two generated ids it gives 0.
- Rewards on masked ids: group estimators sum every reward of a sequence (verl); the token-level
  recursions (GAE, REINFORCE++) ignore them (verl); turn credit counts them for the turn they
  follow.
- `eps` = 1e-6 for group std, 1e-8 inside whitening, as verl.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# GAE and the episode-level estimators under verl's names live in modules of their own;
# importing them here registers them wherever the registry is used.
import agentrl.algos.gae  # noqa: F401
import agentrl.algos.outcome_estimators  # noqa: F401
from agentrl.algos.estimator import Estimate, EstimatorInput, takes_record
from agentrl.algos.returns import EPS, TurnDepths, group_stats, masked_whiten, turn_ends, turn_returns
from agentrl.config import AlgorithmConfig
from agentrl.errors import ConfigError, RegistryError
from agentrl.registry import ESTIMATORS, register_estimator


def compute_advantages(name: str, inputs: EstimatorInput) -> Estimate:
    """Run the estimator registered under `name` on `inputs` (credit=outcome first moves rewards
    to the end); (advantages, returns), both (B, T) float32."""
    fn = ESTIMATORS.get(name)
    if inputs.config.credit == "outcome":
        inputs = inputs.replace(token_rewards=outcome_rewards(inputs.token_rewards, inputs.response_mask))
    _check_form(name, fn)  # plan() checked it; an estimator registered since is checked here
    estimate: Estimate = fn(inputs)
    return estimate


def check_estimator(name: str) -> None:
    """Raise a one-line ConfigError unless `name` is a registered estimator taking one record."""
    try:
        fn = ESTIMATORS.get(name)
    except RegistryError as e:
        raise ConfigError(f"algorithm.adv_estimator: {e}") from None
    _check_form(name, fn)


def _check_form(name: str, fn: Callable[..., Any]) -> None:
    if not takes_record(fn):
        raise ConfigError(f"algorithm.adv_estimator: estimator {name!r} ({getattr(fn, '__qualname__', fn)}) must "
                          "take one argument, an agentrl.algos.estimator.EstimatorInput, and return "
                          "(advantages, returns)")


def uses_role_baselines(name: str) -> bool:
    """Whether the estimator `name` reads running baselines per (game, role) (RAE)."""
    return bool(getattr(ESTIMATORS.get(name), "role_baselines", False))


def uses_greedy_baseline(name: str) -> bool:
    """Whether the estimator `name` needs one greedy episode per group as its baseline (ReMax)."""
    return bool(getattr(ESTIMATORS.get(name), "greedy_baseline", False))


@register_estimator("grpo")
def grpo(x: EstimatorInput) -> Estimate:
    """GRPO (Shao et al. 2024): (score - group mean) / (group std + eps), (B, T).

    Scores are sequence reward sums (token/outcome credit) or turn returns (turn credit: turn k is
    compared with turn k of the group's episodes, 0 where no other reached it; see TurnDepths).
    Std is torch.std's unbiased one as in verl;
    `norm_adv_by_std_in_grpo=false` gives Dr. GRPO. Returns equal the advantages.
    """
    if x.config.credit == "turn":
        return _grpo_turns(x)
    scores = x.token_rewards.sum(dim=-1)
    _, inverse = torch.unique(x.index, return_inverse=True)
    count, mean, std = group_stats(scores, inverse)
    centered = scores - mean[inverse]
    # verl: a group of one has mean 0 and std 1, so its advantage is its raw score.
    single = count[inverse] == 1
    centered = torch.where(single, scores, centered)
    std_row = torch.where(single, torch.ones_like(scores), std[inverse])
    adv = centered / (std_row + EPS) if x.config.norm_adv_by_std_in_grpo else centered
    adv = adv.unsqueeze(-1) * x.response_mask
    return adv, adv


def _grpo_turns(x: EstimatorInput) -> Estimate:
    depth = TurnDepths(turn_returns(x.token_rewards, x.response_mask, x.config.gamma), x.response_mask, x.index)
    count, mean, std = group_stats(depth.scores, depth.key)
    alone = count[depth.key] == 1  # mean 0, std 1, as a group of one; drop_lone zeroes it in a larger one
    adv = depth.scores - torch.where(alone, 0.0, mean[depth.key])
    if x.config.norm_adv_by_std_in_grpo:
        adv = adv / (torch.where(alone, 1.0, std[depth.key]) + EPS)
    out = depth.spread(depth.drop_lone(adv))
    return out, out


@register_estimator("gigpo")
def gigpo(x: EstimatorInput) -> Estimate:
    """GiGPO (Feng et al. 2025): episode-level GRPO plus a step-level advantage, (B, T).

    Turns that start from the same env state in one group (an anchor group) are compared by
    their discounted turn returns: (G_k - mean) / (std + eps). Weighted by `episode_adv_weight`
    and `step_adv_weight`. Deviation: an anchor group of one turn gets step advantage 0.
    """
    state_ids, config = x.state_ids, x.config
    if state_ids is None:
        raise ValueError("gigpo needs state_ids (the env state each turn started from)")
    outcome = AlgorithmConfig(**{**config.__dict__, "credit": "outcome"})
    episode, _ = grpo(x.replace(values=None, config=outcome, state_ids=None))
    returns = turn_returns(x.token_rewards, x.response_mask, config.gamma)
    ends = turn_ends(x.response_mask) & (state_ids >= 0)
    size = int(state_ids.max()) + 1 if state_ids.numel() else 0
    count, mean, std = group_stats(returns[ends], state_ids[ends], size)
    sid = state_ids.clamp(min=0)
    step = returns - mean[sid]
    if config.norm_adv_by_std_in_grpo:
        step = step / (std[sid] + EPS)
    step = torch.where((state_ids >= 0) & (count[sid] > 1), step, torch.zeros_like(step))
    adv = (config.episode_adv_weight * episode + config.step_adv_weight * step) * x.response_mask
    return adv, adv


# ---------------------------------------------------------------------------- shared pieces
def outcome_rewards(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's summed reward moved onto its last generated id, (B, T)."""
    out = torch.zeros_like(token_rewards)
    positions = torch.arange(response_mask.shape[1]).expand_as(response_mask)
    last = torch.where(response_mask > 0, positions, -1).max(dim=1).values
    rows = (last >= 0).nonzero(as_tuple=True)[0]
    out[rows, last[rows]] = token_rewards[rows].sum(dim=1)
    return out


def discounted_returns(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-token discounted returns over generated ids, skipping masked ids, (B, T).

    R_t = r_t + gamma * R_{t'} with t' the next generated id. Rewards on masked ids are ignored,
    as verl's recursive estimators ignore them.
    """
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        running = torch.where(response_mask[:, t] > 0, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return returns * response_mask


def _broadcast_group(scores: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, std) of each row's group, aligned with rows."""
    _, inverse = torch.unique(index, return_inverse=True)
    count, mean, std = group_stats(scores, inverse)
    return count[inverse], mean[inverse], std[inverse]


# ---------------------------------------------------------------------------- RLOO
@register_estimator("rloo")
def rloo(x: EstimatorInput) -> Estimate:
    """RLOO (Ahmadian et al. 2024): score minus the mean score of the other episodes, (B, T).

    Token/outcome credit is verl's compute_rloo_outcome_advantage. Turn credit: turn k's return
    minus the mean return of turn k in the group's other episodes (0 if none reached it; the raw
    return in a group of one).
    """
    if x.config.credit == "turn":
        depth = TurnDepths(turn_returns(x.token_rewards, x.response_mask, x.config.gamma), x.response_mask, x.index)
        count, mean, _ = group_stats(depth.scores, depth.key)
        n = count[depth.key]
        others = (mean[depth.key] * n - depth.scores) / (n - 1).clamp(min=1)
        out = depth.spread(depth.drop_lone(depth.scores - torch.where(n > 1, others, 0.0)))
        return out, out
    scores = x.token_rewards.sum(dim=-1)
    count, mean, _ = _broadcast_group(scores, x.index)
    n = count
    loo = scores * n / (n - 1).clamp(min=1) - mean * n / (n - 1).clamp(min=1)
    adv = torch.where(n > 1, loo, scores).unsqueeze(-1) * x.response_mask
    return adv, adv


# ---------------------------------------------------------------------------- REINFORCE++
@register_estimator("reinforce_plus_plus")
def reinforce_plus_plus(x: EstimatorInput) -> Estimate:
    """REINFORCE++ (Hu 2025): discounted returns whitened over the batch's generated ids, (B, T).

    Token/outcome credit: verl's compute_reinforce_plus_plus_outcome_advantage with transparent
    masks (verl restarts the running return at masked ids; on single-turn masks they agree).
    Turn credit: every id of a turn gets the turn's return G_k. Returns are the unwhitened ones.
    """
    if x.config.credit == "turn":
        returns = turn_returns(x.token_rewards, x.response_mask, x.config.gamma)
    else:
        returns = discounted_returns(x.token_rewards, x.response_mask, x.config.gamma)
    adv = masked_whiten(returns, x.response_mask) * x.response_mask
    return adv, returns


@register_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(x: EstimatorInput) -> Estimate:
    """REINFORCE++-baseline: score minus its group mean, then whitened over the batch, (B, T).

    Token/outcome credit is verl's compute_reinforce_plus_plus_baseline_outcome_advantage.
    Turn credit: turn k's return minus the group's mean return of turn k (a turn no other episode
    reached: 0; in a group of one, its raw return).
    """
    if x.config.credit == "turn":
        depth = TurnDepths(turn_returns(x.token_rewards, x.response_mask, x.config.gamma), x.response_mask, x.index)
        count, mean, _ = group_stats(depth.scores, depth.key)
        centered = depth.spread(depth.drop_lone(depth.scores - torch.where(count[depth.key] > 1, mean[depth.key], 0.0)))
    else:
        scores = x.token_rewards.sum(dim=-1)
        count, mean, _ = _broadcast_group(scores, x.index)
        centered = torch.where(count > 1, scores - mean, scores).unsqueeze(-1).expand_as(x.response_mask)
    adv = masked_whiten(centered * x.response_mask, x.response_mask) * x.response_mask
    return adv, adv
