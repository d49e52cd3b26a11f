"""The advantage estimators' contract: one input record, and how a registered estimator is called.

Every estimator reads one `EstimatorInput` and returns (advantages, returns), both (B, T) float32
and zero where `response_mask` is 0; what each one computes is in agentrl/algos/advantages.py.

How `compute_advantages` calls an estimator registered with `register_estimator`, by its signature:
- one parameter without a default: the record, `fn(inputs) -> (advantages, returns)`;
- more: the earlier positional form, `fn(token_rewards, response_mask, index, values, config,
  state_ids=None)`, with `reward_baselines=` as a keyword too when `fn.greedy_baseline` is True.
Estimators written in that form keep working, and may call the built-ins in it as well: each
built-in takes the record, and `accepts_positional` lets it also be called with those arguments.
"""

from __future__ import annotations

import dataclasses
import functools
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
    algorithm's settings. Fields in the order of the earlier positional form."""

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

    def replace(self, **changes: Any) -> EstimatorInput:
        """A copy with `changes` applied (the record is frozen)."""
        return dataclasses.replace(self, **changes)


Estimator = Callable[[EstimatorInput], Estimate]


def takes_record(fn: Callable[..., Estimate]) -> bool:
    """Whether `fn` is called with the record (one parameter without a default), not positionally."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in inspect.signature(fn).parameters.values()
                if p.kind in positional and p.default is inspect.Parameter.empty]
    return len(required) == 1


def call_estimator(fn: Callable[..., Estimate], inputs: EstimatorInput) -> Estimate:
    """Run a registered estimator on `inputs`, in the form its signature asks for (module docstring)."""
    if takes_record(fn):
        return fn(inputs)
    extra = {"reward_baselines": inputs.reward_baselines} if getattr(fn, "greedy_baseline", False) else {}
    return fn(inputs.token_rewards, inputs.response_mask, inputs.index, inputs.values, inputs.config,
              inputs.state_ids, **extra)


def accepts_positional(fn: Estimator) -> Callable[..., Estimate]:
    """`fn`, callable with its record or with the record's fields as arguments (the earlier form)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Estimate:
        if len(args) == 1 and not kwargs and isinstance(args[0], EstimatorInput):
            return fn(args[0])
        return fn(EstimatorInput(*args, **kwargs))

    return call
