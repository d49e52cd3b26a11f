"""The learning side of a run: the actor that updates the policy (with LoRA adapters when
model.lora.rank > 0), and the reference and critic when the run uses them (all read from the
run's plan)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from agentrl.models.lora import apply_lora
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.process import seed_everything
from agentrl.train.actor import Actor, Reference
from agentrl.train.critic import Critic, ValueModel
from agentrl.train.forward import ForwardOptions


def build_learners(run_plan: RunPlan, model: Any, device: torch.device
                   ) -> tuple[Actor, Reference | None, Critic | None]:
    """The actor that updates `model` (wrapped with LoRA adapters when model.lora.rank > 0), and
    the reference and critic when the run uses them."""
    m = run_plan.model
    if m.use_remove_padding and packed_kernels_available(model, device):
        # Variable-length kernels: packed sequences cost what their own lengths cost. Without
        # them sdpa gets a block-diagonal mask: right, but its attention computes the masked blocks.
        model.set_attn_implementation("flash_attention_2")
    if m.enable_gradient_checkpointing:
        # Non-reentrant checkpointing needs no input that requires grad (a frozen LoRA base).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = apply_lora(model, m.lora, run_plan.seed) if m.lora.enabled else model
    actor = Actor(policy, run_plan.actor, temperature=run_plan.rollout.temperature, horizon=run_plan.update_horizon,
                  packed=m.use_remove_padding)
    # With LoRA the reference is the policy with its adapters off: no copy.
    reference = (build_reference(run_plan, policy if m.lora.enabled else copy.deepcopy(model))
                 if run_plan.reference else None)
    critic = build_critic(run_plan, policy, device) if run_plan.critic.enable else None
    return actor, reference, critic


def build_reference(run_plan: RunPlan, model: Any) -> Reference:
    """The frozen reference policy, from its own copy of the starting model."""
    a = run_plan.actor
    options = ForwardOptions(a.micro_batch_size, a.max_tokens_per_micro_batch, run_plan.model.use_remove_padding,
                             a.share_prefixes, a.logits_chunk_size)
    return Reference(model, options, run_plan.rollout.temperature)


def build_critic(run_plan: RunPlan, model: Any, device: torch.device) -> Critic:
    """The critic: the policy's body with a fresh value head (seeded: the same in every runtime)."""
    seed_everything(run_plan.seed)
    return Critic(ValueModel(model).to(device), run_plan.critic, run_plan.update_horizon,
                  packed=run_plan.model.use_remove_padding)


def packed_kernels_available(model: Any, device: torch.device) -> bool:
    """Whether flash-attention's variable-length kernels can run the trainer's packed passes
    (CUDA, half-precision weights, the flash_attn package installed)."""
    import importlib.util

    dtype = next(model.parameters()).dtype
    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
            and importlib.util.find_spec("flash_attn") is not None)
