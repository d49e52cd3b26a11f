"""Building the parts of a run from a config and its plan (runtime/plan.py: env factories,
groups, horizon, made once after every model-free check), in three pieces: the policy (model,
tokenizer), the rollout side (engine, agents, collector, task source, rollout source) and the
learning side (actor, reference, critic); then the trainer that holds them. Where they run is
the caller's business: runtime/local.py runs all of them in this process; a runtime that places
the engine elsewhere replaces `build_rollout`."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import Config
from agentrl.envs.service import close_env
from agentrl.errors import ConfigError
from agentrl.models.lora import apply_lora
from agentrl.rollout.source import RolloutSource, rollout_source
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.engines import make_engine
from agentrl.runtime.envs import check_templates, make_budget, make_collector
from agentrl.runtime.plan import RunPlan, needs_reference, plan, update_horizon
from agentrl.runtime.threads import pin_threads
from agentrl.runtime.warm import load_policy, model_context, model_vocab
from agentrl.train.actor import Actor, Reference
from agentrl.train.critic import Critic, ValueModel
from agentrl.train.forward import ForwardOptions
from agentrl.train.trainer import Trainer


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but no CUDA device is available; use device=auto or cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class RunParts:
    """Everything a trainer is made of, built from one config."""

    tokenizer: Any
    rollout: RolloutSource  # plays the episodes (holds the engine, collector and task source)
    actor: Actor
    reference: Reference | None
    critic: Critic | None
    eval_baselines: dict[str, Callable]


def build_trainer(cfg: Config, run_dir: Path, log: Callable[[str], None] = print, tokenizer: Any = None,
                  run_plan: RunPlan | None = None) -> Trainer:
    """The trainer of `cfg`, with every part built here (with `tokenizer` instead of the model's
    own when given; `run_plan`: the plan of `cfg` the caller already made)."""
    parts = build_parts(cfg, log, tokenizer, run_plan)
    trainer = Trainer(cfg, parts.actor, parts.rollout, parts.tokenizer, run_dir, eval_baselines=parts.eval_baselines,
                      reference=parts.reference, critic=parts.critic)
    trainer.log = log
    return trainer


def build_parts(cfg: Config, log: Callable[[str], None] = print, tokenizer: Any = None,
                run_plan: RunPlan | None = None) -> RunParts:
    """Check the config, then build the policy, the rollout side and the learning side.

    The order of the steps that draw random numbers is fixed: the same config and seed give
    the same parts."""
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    model, tokenizer, run_plan = build_policy(cfg, log, tokenizer, run_plan)
    model.to(device)
    seed_everything(cfg.seed)
    rollout = build_rollout(cfg, model, tokenizer, run_plan, device)
    actor, reference, critic = build_learners(cfg, model, device)
    return RunParts(tokenizer, rollout, actor, reference, critic, eval_baselines(run_plan.factories))


def build_policy(cfg: Config, log: Callable[[str], None], tokenizer: Any = None,
                 run_plan: RunPlan | None = None) -> tuple[Any, Any, RunPlan]:
    """(model, tokenizer, the run's plan), after every check that needs no model (the plan is
    made here unless the caller made it); from here on this process computes with the run's
    torch threads (the warm start included)."""
    pin_threads(cfg.runtime.num_threads)
    if run_plan is None:
        run_plan = plan(cfg, tokenizer)  # every model-free check, before the model is built or warm-started
    model, tokenizer = load_policy(cfg, run_plan, log, tokenizer)
    check_templates(cfg, tokenizer)
    return model, tokenizer, run_plan


def build_rollout(cfg: Config, model: Any, tokenizer: Any, run_plan: RunPlan, device: torch.device) -> RolloutSource:
    """The engine (a copy of `model`, or the servers of engine.urls), the agents and envs of every
    tag, and the rollout source that plays them; a runtime that places the engine elsewhere
    replaces this."""
    engine = make_engine(cfg, model, tokenizer, device)  # in this process, or the servers of engine.urls
    budget = make_budget(cfg, model_context(model))
    collector = make_collector(cfg, tokenizer, run_plan.factories, engine, budget, model_vocab(model))
    tasks = TaskSource(cfg.seed, run_plan.group_size, run_plan.train_groups, run_plan.val_groups,
                       greedy_baselines=run_plan.greedy_baselines)
    return rollout_source(collector, engine, tasks, run_plan.max_staleness,
                          accept_stale=run_plan.stale_samples == "correct")


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


def eval_baselines(factories: dict[str, Callable]) -> dict[str, Callable]:
    """{tag: env.eval_baselines} for the envs that offer reference policies."""
    out = {}
    for tag, make_env in factories.items():
        env = make_env()
        if callable(getattr(env, "eval_baselines", None)):
            out[tag] = env.eval_baselines
        close_env(env)
    return out
