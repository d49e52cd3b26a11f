"""Non-finite losses and gradients stop training with an error naming their source.

Skipping such an update silently (as a NaN reward once made every update be skipped) trains
nothing while the run reports success. Rewards are checked where they enter (the collector's
env contract); what is checked here is what the update computes from them: each loss term,
and the gradient norm.
"""

from __future__ import annotations

import math

import torch

from agentrl.errors import TrainingError


def _state(t: torch.Tensor | None, mask: torch.Tensor) -> str:
    if t is None:
        return "absent"
    values = t[mask.bool()] if t.shape == mask.shape else t
    return "finite" if bool(torch.isfinite(values).all()) else "NOT finite"


def check_loss(where: str, value: float, terms: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor | None],
               mask: torch.Tensor) -> None:
    """Raise TrainingError when `value` (the summed loss of a micro-batch) is not finite, naming
    the first non-finite term of `terms` and whether each input tensor is finite on `mask`."""
    if math.isfinite(value):
        return
    bad = next((name for name, t in terms.items() if not bool(torch.isfinite(t.detach()).all())),
               "sum of the loss terms")
    seen = ", ".join(f"{name} {_state(t, mask)}" for name, t in inputs.items())
    raise TrainingError(f"{where}: the {bad} is {value} (not finite); inputs on generated tokens: {seen}. "
                        "Training stops instead of skipping the update; check the rewards and the learning rate")


def check_grad_norm(where: str, norm: float) -> None:
    """Raise TrainingError when a gradient norm is not finite although the loss was."""
    if not math.isfinite(norm):
        raise TrainingError(f"{where}: the gradient norm is {norm} (not finite) from a finite loss; the weights "
                            "were not updated. Training stops instead of skipping the update; lower the learning "
                            "rate or use model.dtype=float32")
