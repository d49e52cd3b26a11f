"""The policy as the trainer sees it: the `Learner` protocol.

`Actor` (train/actor.py) is one in one process; `ShardedActor` (runtime/ray/train_actors.py) is one
over several Ray trainer ranks, rank 0's `Actor` plus the ranks it drives. The trainer and its
watch hold a `Learner` and never ask which they have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from agentrl.train.batch import Batch
    from agentrl.train.precision import MasterWeights


@runtime_checkable
class Learner(Protocol):
    """Each step: `schedule`, `compute_logprobs`, `update`, then `engine_weights` for the engines.
    Checkpoints save `model`, `optimizer` and `master`, and a resume hands them back to `load_state`;
    the health checks score replies with `model` on `device` at `temperature`."""

    @property
    def model(self) -> torch.nn.Module:
        """The policy's model (rank 0's over several ranks)."""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Its optimizer, over the trainable weights' float32 master copies."""

    @property
    def master(self) -> MasterWeights:
        """The float32 master copies of the trainable weights."""

    @property
    def device(self) -> torch.device:
        """Where the model lives."""

    @property
    def temperature(self) -> float:
        """The sampling temperature its logprobs are computed at (rollout.temperature)."""

    def schedule(self, step: int, total: int) -> float:
        """Set the learning rate for training step `step` (0-based) of `total`; returns it."""

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """The current policy's logprobs of every token of `batch`, (B, T) float32."""

    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over the scored batch; the step's policy metrics."""

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """What an engine needs to serve the current policy (the adapters alone with LoRA)."""

    def load_state(self, weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any],
                   master: dict[int, torch.Tensor] | None = None) -> None:
        """Continue from a checkpoint: its trained weights, optimizer state and master copies."""
