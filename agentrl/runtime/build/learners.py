"""The learning side of a run: the actor that updates the policy (with LoRA adapters when
model.lora.rank > 0), and the reference and critic when the config uses them."""

from __future__ import annotations

import copy
from typing import Any

import torch

from agentrl.config import Config
from agentrl.models.lora import apply_lora
from agentrl.runtime.process import seed_everything
from agentrl.train.actor import Actor, Reference
from agentrl.train.critic import Critic, ValueModel
from agentrl.train.forward import ForwardOptions


def build_learners(cfg: Config, model: Any, device: torch.device) -> tuple[Actor, Reference | None, Critic | None]:
    """The actor that updates `model` (wrapped with LoRA adapters when model.lora.rank > 0), and
    the reference and critic when the config uses them."""
    m = cfg.model
    if m.use_remove_padding and packed_kernels_available(model, device):
        # Variable-length kernels: packed sequences cost what their own lengths cost. Without
        # them sdpa gets a block-diagonal mask: right, but its attention computes the masked blocks.
        model.set_attn_implementation("flash_attention_2")
    if m.enable_gradient_checkpointing:
        # Non-reentrant checkpointing needs no input that requires grad (a frozen LoRA base).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = apply_lora(model, m.lora, cfg.seed) if m.lora.enabled else model
    actor = Actor(policy, cfg.actor, temperature=cfg.rollout.temperature, horizon=update_horizon(cfg),
                  packed=m.use_remove_padding)
    # With LoRA the reference is the policy with its adapters off: no copy.
    reference = (build_reference(cfg, policy if m.lora.enabled else copy.deepcopy(model))
                 if needs_reference(cfg) else None)
    critic = build_critic(cfg, policy, device) if cfg.critic.enable else None
    return actor, reference, critic


def update_horizon(cfg: Config) -> float:
    """The most tokens an episode generates: the constant of the *-token-sum-norm loss modes."""
    horizon = float(cfg.rollout.max_new_tokens * cfg.max_turns())
    if cfg.rollout.max_episode_tokens:
        horizon = min(horizon, float(cfg.rollout.max_episode_tokens))
    return horizon


def needs_reference(cfg: Config) -> bool:
    """The reference exists only when a KL term needs it: it costs a model copy and a forward."""
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def build_reference(cfg: Config, model: Any) -> Reference:
    """The frozen reference policy, from its own copy of the starting model."""
    options = ForwardOptions(cfg.actor.micro_batch_size, cfg.actor.max_tokens_per_micro_batch,
                             cfg.model.use_remove_padding)
    return Reference(model, options, cfg.rollout.temperature)


def build_critic(cfg: Config, model: Any, device: torch.device) -> Critic:
    """The critic: the policy's body with a fresh value head (seeded: the same in every runtime)."""
    seed_everything(cfg.seed)
    return Critic(ValueModel(model).to(device), cfg.critic, update_horizon(cfg), packed=cfg.model.use_remove_padding)


def packed_kernels_available(model: Any, device: torch.device) -> bool:
    """Whether flash-attention's variable-length kernels can run the trainer's packed passes
    (CUDA, half-precision weights, the flash_attn package installed)."""
    import importlib.util

    dtype = next(model.parameters()).dtype
    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
            and importlib.util.find_spec("flash_attn") is not None)
