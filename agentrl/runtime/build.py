"""Building the parts of a run from a config: model, engine, agents, collector, rollout source,
actor (reference, critic) and the trainer that holds them. Where they run is the caller's
business (runtime/local.py: all in this process)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.algos.policy_losses import check_loss_mode
from agentrl.config import Config
from agentrl.envs.service import close_env
from agentrl.errors import ConfigError
from agentrl.llm.local import LocalEngine
from agentrl.models.loading import DTYPES
from agentrl.registry import load_builtins
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.source import rollout_source
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.envs import check_templates, make_budget, make_tag_specs
from agentrl.runtime.preflight import preflight
from agentrl.runtime.warm import load_policy, model_context
from agentrl.train.actor import Actor, Reference
from agentrl.train.critic import Critic, ValueModel
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


def build_trainer(cfg: Config, run_dir: Path, log: Callable[[str], None] = print, tokenizer: Any = None) -> Trainer:
    """Build env factories, model, engine, agents, collector, actor and trainer from `cfg`
    (with `tokenizer` instead of the model's own when given)."""
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    load_builtins()
    factories = preflight(cfg)  # every model-free check, before the model is built or warm-started
    check_loss_mode(cfg.actor.policy_loss.loss_mode)  # after `imports`, which may register modes
    model, tokenizer = load_policy(cfg, factories, log, tokenizer)
    check_templates(cfg, tokenizer)
    budget = make_budget(cfg, model_context(model))
    model.to(device)
    seed_everything(cfg.seed)
    engine_model = copy.deepcopy(model).to(device=device, dtype=DTYPES[cfg.model.dtype])
    engine = LocalEngine.from_config(engine_model, tokenizer, cfg.engine, cfg.rollout.max_model_len, seed=cfg.seed)
    collector = RolloutCollector(make_tag_specs(cfg, tokenizer, factories, budget), engine,
                                 timeout=cfg.rollout.episode_timeout, max_retries=cfg.rollout.max_retries)
    horizon = float(cfg.rollout.max_new_tokens * cfg.max_turns())  # most tokens an episode generates
    if cfg.rollout.max_episode_tokens:
        horizon = min(horizon, float(cfg.rollout.max_episode_tokens))
    actor = Actor(model, cfg.actor, temperature=cfg.rollout.temperature, horizon=horizon)
    # The reference exists only when a KL term needs it: it costs a model copy and a forward.
    needs_ref = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    reference = (Reference(copy.deepcopy(model), cfg.actor.micro_batch_size, cfg.rollout.temperature)
                 if needs_ref else None)
    critic = None
    if cfg.critic.enable:
        seed_everything(cfg.seed)
        critic = Critic(ValueModel(model).to(device), cfg.critic, horizon)
    tasks = TaskSource(cfg.seed, cfg.rollout.group_size, tuple(cfg.group_tags("train")), tuple(cfg.group_tags("val")))
    source = rollout_source(collector, engine, tasks, cfg.rollout.max_staleness,
                            accept_stale=cfg.rollout.stale_samples == "correct")
    trainer = Trainer(cfg, actor, source, tokenizer, run_dir, eval_baselines=eval_baselines(factories),
                      reference=reference, critic=critic)
    trainer.log = log
    return trainer


def eval_baselines(factories: dict[str, Callable]) -> dict[str, Callable]:
    """{tag: env.eval_baselines} for the envs that offer reference policies."""
    out = {}
    for tag, make_env in factories.items():
        env = make_env()
        if callable(getattr(env, "eval_baselines", None)):
            out[tag] = env.eval_baselines
        close_env(env)
    return out
