"""float32 master weights for a model that computes in bfloat16.

With `model.dtype=bfloat16` the trainer's model holds bfloat16 weights, so its forward passes
run the same arithmetic as the engine's bfloat16 copy (measured in benchmarks/gpu_suite.py:
this keeps the engine/trainer logprob gap smaller than autocast over float32 weights, whose
residual stream stays in float32 while the engine's does not). A bfloat16 weight cannot take
an update much smaller than itself (8 bits of mantissa), so the optimizer steps float32 copies
of the trainable weights and writes them back, rounded, after each step: the optimizer state
and the master copies are float32 (16 bytes per trained parameter with AdamW, as mixed
precision in verl's FSDP or DeepSpeed). Parameters already in float32 (LoRA adapters, the
default float32 model) are stepped as they are, with no copy.
"""

from __future__ import annotations

import torch


class MasterWeights:
    """The trainable parameters as the optimizer sees them: float32, copies where needed."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.model_params = params
        self.copies = {i: p.detach().float().clone().requires_grad_(True)
                       for i, p in enumerate(params) if p.dtype != torch.float32}
        self.params = [self.copies.get(i, p) for i, p in enumerate(params)]

    @property
    def active(self) -> bool:
        """Whether any parameter has a float32 copy."""
        return bool(self.copies)

    def grads_to_master(self) -> None:
        """Move the model's low-precision gradients onto the float32 copies (as float32)."""
        for i, master in self.copies.items():
            p = self.model_params[i]
            master.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def master_to_model(self) -> None:
        """Write the stepped float32 copies back into the model's weights (rounded)."""
        for i, master in self.copies.items():
            self.model_params[i].copy_(master)

    def state_dict(self) -> dict[int, torch.Tensor]:
        """The float32 copies by parameter index (a checkpoint needs them to resume exactly)."""
        return {i: m.detach().cpu() for i, m in self.copies.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[int, torch.Tensor] | None) -> None:
        """Restore the copies; without a saved state they restart from the model's weights."""
        for i, master in self.copies.items():
            source = state[i] if state is not None and i in state else self.model_params[i]
            master.copy_(source)
