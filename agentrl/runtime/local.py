"""The local runtime: build every part from a config and run the loop in this process."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import agentrl.agents.chat  # noqa: F401  (importing the built-ins registers them)
import agentrl.agents.math_retry  # noqa: F401
import agentrl.algos.advantages  # noqa: F401
import agentrl.envs.frozen_lake  # noqa: F401
import agentrl.envs.math  # noqa: F401
import agentrl.envs.sokoban  # noqa: F401
from agentrl.config import Config, save_config, to_dict
from agentrl.errors import ConfigError, RegistryError
from agentrl.llm.local import LocalEngine
from agentrl.models.loading import DTYPES, load_pretrained, save_pretrained
from agentrl.registry import ESTIMATORS
from agentrl.rollout.collector import RolloutCollector, make_tasks
from agentrl.runtime.envs import (agent_texts, check_agents, check_templates, import_user_modules, is_seed_tag,
                                  make_budget, make_env_factories, make_tag_specs)
from agentrl.runtime.run_folder import (RunLock, check_folder, finished_summary, prepare_fresh, record_resume,
                                        resume_changes, run_step)
from agentrl.train.actor import Actor, Reference
from agentrl.train.checkpoint import remove_partial
from agentrl.train.critic import Critic, ValueModel
from agentrl.train.trainer import Trainer

WARM_START_VERSION = 6  # bump when the warm-start recipe changes, to invalidate cached models
DEMO_SEED_BASE = 2_000_000


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


def check_estimator(cfg: Config) -> None:
    """algorithm.adv_estimator must name a registered estimator."""
    try:
        ESTIMATORS.get(cfg.algorithm.adv_estimator)
    except RegistryError as e:
        raise ConfigError(f"algorithm.adv_estimator: {e}") from None


def model_context(model: Any) -> int:
    """The longest sequence the model takes."""
    return int(getattr(model.config, "max_position_embeddings", 4096))


# ---------------------------------------------------------------------------- the model
def cache_root(cfg: Config) -> Path:
    """Where warm-started tiny models are cached."""
    root = cfg.model.cache_dir or os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl"
    return Path(root).expanduser()


def tiny_cache_key(cfg: Config) -> str:
    """Hash of everything the warm-started tiny model depends on."""
    tags = list(cfg.env_definitions())
    parts = {"v": WARM_START_VERSION, "tiny": to_dict(cfg.model.tiny), "warm": to_dict(cfg.model.warm_start),
             "envs": {t: to_dict(cfg.env_definitions()[t]) for t in tags},
             "agents": {t: to_dict(cfg.agent_for(t)) for t in tags}, "plan": cfg.group_tags("train"),
             "imports": cfg.imports, "seed": cfg.seed, "max_new_tokens": cfg.rollout.max_new_tokens,
             "budget": [cfg.rollout.max_episode_tokens, cfg.rollout.max_model_len]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def load_policy(cfg: Config, factories: dict[str, Callable], log: Callable[[str], None]) -> tuple[Any, Any]:
    """(model, tokenizer): from model.path, or the cached / freshly warm-started tiny default."""
    if cfg.model.path:
        return load_pretrained(cfg.model.path, cfg.model.dtype)
    path = cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"
    if (path / "config.json").is_file():
        try:
            return load_pretrained(path, cfg.model.dtype)
        except ConfigError as e:  # a damaged cache entry is rebuilt, not blamed on model.path
            reason = str(e).split("': ", 1)[-1]
            log(f"warning: the cached tiny model at {path} does not load ({reason}); rebuilding it")
    log(f"building the embedded tiny model (cached at {path})")
    model, tokenizer = build_tiny(cfg, factories, log)
    save_pretrained(model, tokenizer, path)
    return load_pretrained(path, cfg.model.dtype)


def build_tiny(cfg: Config, factories: dict[str, Callable], log: Callable[[str], None]) -> tuple[Any, Any]:
    """Train the tokenizer on every env of the run, build the tiny model and warm-start it on
    demonstrations of every tag, in the proportions of the training batches."""
    from agentrl.models.tiny import build_model, build_tokenizer
    from agentrl.rollout.demos import ScriptedClient, corpus
    from agentrl.train.warm_start import warm_start

    definitions = cfg.env_definitions()

    def texts():
        for tag, make_env in factories.items():
            yield from corpus(make_env, max_turns=definitions[tag].max_turns, seed=cfg.seed,
                              step=not is_seed_tag(cfg, tag))
        yield from agent_texts(cfg)

    tokenizer = build_tokenizer(texts(), cfg.model.tiny.vocab_size)
    model = build_model(cfg.model.tiny, tokenizer, seed=cfg.seed)
    client = ScriptedClient(tokenizer)
    budget = make_budget(cfg, model_context(model))
    collector = RolloutCollector(make_tag_specs(cfg, tokenizer, factories, budget, wrap=client.wrap), client)
    plan = cfg.group_tags("train")
    ws = cfg.model.warm_start
    demo_tags = [plan[i * len(plan) // ws.batch_size] for i in range(ws.batch_size)]  # the batch's mix

    def demos(step: int):
        tasks = make_tasks(cfg.seed, step, ws.batch_size, 1, seed_base=DEMO_SEED_BASE, tags=demo_tags)
        client.reset_entropy()
        return collector.collect(tasks).trajectories, client.reply_entropy

    stats = warm_start(model, demos, ws, tokenizer.pad_token_id, log)
    log(f"warm start done: {stats['steps']} steps, loss {stats['loss']:.4f} (floor {stats['floor']:.4f})")
    return model, tokenizer


# ---------------------------------------------------------------------------- the run
def build_trainer(cfg: Config, run_dir: Path, log: Callable[[str], None] = print) -> Trainer:
    """Build env factories, model, engine, agents, collector, actor and trainer from `cfg`."""
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    check_estimator(cfg)
    import_user_modules(cfg)
    factories = make_env_factories(cfg)
    check_agents(cfg)
    model, tokenizer = load_policy(cfg, factories, log)
    check_templates(cfg, tokenizer)
    budget = make_budget(cfg, model_context(model))
    model.to(device)
    seed_everything(cfg.seed)
    engine_model = copy.deepcopy(model).to(device=device, dtype=DTYPES[cfg.model.dtype])
    engine = LocalEngine.from_config(engine_model, tokenizer, cfg.rollout, seed=cfg.seed)
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
    trainer = Trainer(cfg, actor, engine, collector, tokenizer, run_dir, eval_baselines=eval_baselines(factories),
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
        env.close()
    return out


def train(cfg: Config, resume: bool = False, log: Callable[[str], None] = print,
          overwrite: bool = False) -> dict[str, Any]:
    """Run a whole experiment; returns the summary (also written to run_dir/summary.json).

    The run folder is checked before any model is built and locked while the run writes it. A new
    run refuses a folder that holds another run unless `overwrite` (which clears it first); a
    resume refuses config changes that alter the run's meaning, and writes config.yaml only once
    the checkpoint has loaded.
    """
    run_dir = check_folder(cfg)
    with RunLock(run_dir):
        remove_partial(run_dir / "checkpoints")
        if resume:
            changes = resume_changes(cfg, run_dir, run_step(run_dir) or 0)
            done = finished_summary(cfg, run_dir)
            if done is not None:  # resuming it again would only append a second final evaluation
                log(f"run {run_dir} is already finished at step {done['steps']} (trainer.total_steps="
                    f"{cfg.trainer.total_steps}); nothing to do: raise trainer.total_steps to train further")
                return done
        else:
            prepare_fresh(run_dir, overwrite)
            save_config(cfg, run_dir / "config.yaml")
        trainer = build_trainer(cfg, run_dir, log)
        if resume:
            trainer._restore()
            # Only now is the new config proven to fit the run: write it and record what changed.
            save_config(cfg, run_dir / "config.yaml")
            record_resume(run_dir, trainer.step_idx, changes)
        return trainer.fit(resume=resume)
