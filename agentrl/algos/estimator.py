"""The advantage estimators' contract: one input record.

Every estimator, built-in or registered with `register_estimator`, reads one `EstimatorInput`,
`fn(inputs) -> (advantages, returns)`, both (B, T) float32 and zero where `response_mask` is 0;
what each one computes is in agentrl/algos/advantages.py.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from agentrl.config import AlgorithmConfig

Estimate = tuple[torch.Tensor, torch.Tensor]  # (advantages, returns), both (B, T) float32


@dataclasses.dataclass(frozen=True, eq=False)
class EstimatorInput:
    """What every advantage estimator reads: a packed batch's rewards, masks and groups, and the
    algorithm's settings."""

    token_rewards: torch.Tensor  # (B, T) float32: each turn's reward at its last generated id, 0 elsewhere
    response_mask: torch.Tensor  # (B, T) float32: 1 on ids the policy generated, 0 on prompt/observations/padding
    index: torch.Tensor  # (B,) int64: group id of each sequence (episodes sharing an env seed)
    values: torch.Tensor | None  # (B, T) float32 critic values, values[:, t] = V(ids before t); None without one
    config: AlgorithmConfig
    # (B, T) int64: id of the env state each generated token's turn started from (unique per
    # group), -1 elsewhere, for step-level baselines (GiGPO)
    state_ids: torch.Tensor | None = None
    # (B,) float32: the reward of the group's greedy episode (estimators with greedy_baseline,
    # ReMax), NaN for a row without one; None when the run played no greedy episode
    reward_baselines: torch.Tensor | None = None
    # (B,) float32: each row's running baseline of its (game, role) after its own return (estimators
    # with role_baselines, RAE: outcome_estimators.RoleBaselines); None when the run keeps none
    role_baselines: torch.Tensor | None = None

    def replace(self, **changes: Any) -> EstimatorInput:
        """A copy with `changes` applied (the record is frozen)."""
        return dataclasses.replace(self, **changes)


Estimator = Callable[[EstimatorInput], Estimate]


def takes_record(fn: Callable[..., Any]) -> bool:
    """Whether `fn` takes one record (one positional parameter without a default), as every
    estimator and policy loss does."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in inspect.signature(fn).parameters.values()
                if p.kind in positional and p.default is inspect.Parameter.empty]
    return len(required) == 1
