"""GAE (Schulman et al. 2016): the critic's estimator, per token (verl's) or over turns.

Registered as `gae` (algorithm.adv_estimator=gae with critic.enable=true); it reads every
estimator's input record (agentrl/algos/estimator.py).
"""

from __future__ import annotations

import torch

from agentrl.algos.estimator import Estimate, EstimatorInput
from agentrl.algos.returns import masked_whiten, turn_ids
from agentrl.registry import register_estimator


@register_estimator("gae")
def gae(x: EstimatorInput) -> Estimate:
    """GAE (Schulman et al. 2016) with a critic; advantages whitened over generated ids, (B, T).

    Token/outcome credit is verl's compute_gae_advantage_return (the mask-transparent version:
    values and TD errors of masked ids are skipped). Turn credit runs the recursion over turns:
    delta_k = r_k + gamma V_{k+1} - V_k, A_k = delta_k + gamma lam A_{k+1}, V_k the value before
    turn k's first id; every id of turn k gets A_k and the return target A_k + V_k.
    """
    values, config, mask = x.values, x.config, x.response_mask
    if values is None:
        raise ValueError("adv_estimator 'gae' needs critic values: set critic.enable=true")
    if config.credit == "turn":
        adv, returns = _turn_gae(x.token_rewards, mask, values, config.gamma, config.lam)
    else:
        adv, returns = _token_gae(x.token_rewards, mask, values, config.gamma, config.lam)
    adv = masked_whiten(adv, mask) * mask
    return adv, returns * mask


def bootstrap_truncated(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                        truncated: torch.Tensor, gamma: float) -> torch.Tensor:
    """rollout.on_truncation=bootstrap: each truncated row's last generated id also earns gamma
    times the critic's value there, the estimate of what the episode would have earned had it not
    been cut off; (B, T), a new tensor.

    GAE's recursion takes V = 0 after a sequence's last id, right for a terminated episode; for a
    truncated one, delta_T = r_T + gamma V(s_T) - V(s_T) instead, V(s_T) being the critic's value
    at the last state it saw (the last generated id: no state after it is in the sequence)."""
    out = token_rewards.clone()
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=1).values
    rows = torch.nonzero(truncated & (last >= 0), as_tuple=True)[0]
    out[rows, last[rows]] += gamma * values[rows, last[rows]].to(out.dtype)
    return out


def _token_gae(rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, gamma: float,
               lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    batch, width = rewards.shape
    next_value = torch.zeros(batch, dtype=values.dtype)
    last = torch.zeros(batch, dtype=values.dtype)
    adv = torch.zeros_like(rewards)
    for t in range(width - 1, -1, -1):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        new_last = delta + gamma * lam * last
        next_value = values[:, t] * m + (1 - m) * next_value
        last = new_last * m + (1 - m) * last
        adv[:, t] = last
    return adv, adv + values


def _turn_gae(rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, gamma: float,
              lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    ids = turn_ids(mask)
    n_turns = int(ids.max()) if ids.numel() else 0
    batch = rewards.shape[0]
    per_turn = torch.zeros(batch, n_turns + 1, dtype=rewards.dtype).scatter_add_(1, ids, rewards)
    starts = (mask > 0) & ~torch.nn.functional.pad(mask[:, :-1] > 0, (1, 0), value=False)
    v_turn = torch.zeros(batch, n_turns + 2, dtype=values.dtype)
    present = torch.zeros(batch, n_turns + 2, dtype=values.dtype)
    rows, cols = starts.nonzero(as_tuple=True)
    v_turn[rows, ids[rows, cols]] = values[rows, cols]
    present[rows, ids[rows, cols]] = 1.0
    adv_turn = torch.zeros(batch, n_turns + 1, dtype=values.dtype)
    last = torch.zeros(batch, dtype=values.dtype)
    for k in range(n_turns, 0, -1):
        delta = per_turn[:, k] + gamma * v_turn[:, k + 1] * present[:, k + 1] - v_turn[:, k]
        last = (delta + gamma * lam * last) * present[:, k]
        adv_turn[:, k] = last
    adv = adv_turn.gather(1, ids) * mask
    returns = (adv_turn + v_turn[:, : n_turns + 1]).gather(1, ids) * mask
    return adv, returns
