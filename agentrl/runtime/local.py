"""The local runtime: build every part from a config and run the loop in this process."""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import agentrl.agents.chat  # noqa: F401  (importing the built-ins registers them)
import agentrl.algos.advantages  # noqa: F401
import agentrl.envs.frozen_lake  # noqa: F401
from agentrl.config import Config, save_config, to_dict
from agentrl.errors import ConfigError, RegistryError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local import LocalEngine
from agentrl.models.loading import DTYPES, load_pretrained, save_pretrained
from agentrl.registry import AGENTS, ENVS, ESTIMATORS
from agentrl.rollout.collector import RolloutCollector, make_tasks
from agentrl.train.actor import Actor, Reference
from agentrl.train.critic import Critic, ValueModel
from agentrl.train.trainer import Trainer

WARM_START_VERSION = 5  # bump when the warm-start recipe changes, to invalidate cached models
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


def make_env_factory(cfg: Config) -> Callable[[], Any]:
    """A zero-argument env constructor; checks the env type and its arguments right away."""
    try:
        cls = ENVS.get(cfg.env.type)
    except RegistryError as e:
        raise ConfigError(f"env.type: {e}") from None
    params = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in cfg.env.args if k not in params]
        if unknown:
            raise ConfigError(f"env.args.{unknown[0]} is not an argument of env type '{cfg.env.type}'; "
                              f"accepted: {', '.join(params)}")
    args = dict(cfg.env.args)

    def factory():
        return cls(**args)

    factory().close()  # bad argument values fail now, not inside the first episode
    return factory


def check_estimator(cfg: Config) -> None:
    """algorithm.adv_estimator must name a registered estimator."""
    try:
        ESTIMATORS.get(cfg.algorithm.adv_estimator)
    except RegistryError as e:
        raise ConfigError(f"algorithm.adv_estimator: {e}") from None


def make_sampling(cfg: Config, tokenizer) -> SamplingParams:
    """Training-time sampling parameters from the rollout config."""
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop_token_ids=(tokenizer.eos_token_id,))


def make_agent(cfg: Config, tokenizer) -> Any:
    """The configured agent."""
    try:
        cls = AGENTS.get(cfg.agent.type)
    except RegistryError as e:
        raise ConfigError(f"agent.type: {e}") from None
    return cls(tokenizer=tokenizer, sampling=make_sampling(cfg, tokenizer), max_turns=cfg.env.max_turns,
               system_prompt=cfg.agent.system_prompt)


# ---------------------------------------------------------------------------- the model
def cache_root(cfg: Config) -> Path:
    """Where warm-started tiny models are cached."""
    root = cfg.model.cache_dir or os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl"
    return Path(root).expanduser()


def tiny_cache_key(cfg: Config) -> str:
    """Hash of everything the warm-started tiny model depends on."""
    parts = {"v": WARM_START_VERSION, "tiny": to_dict(cfg.model.tiny), "warm": to_dict(cfg.model.warm_start),
             "env": to_dict(cfg.env), "agent": to_dict(cfg.agent), "seed": cfg.seed,
             "max_new_tokens": cfg.rollout.max_new_tokens}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def load_policy(cfg: Config, env_factory: Callable, log: Callable[[str], None]) -> tuple[Any, Any]:
    """(model, tokenizer): from model.path, or the cached / freshly warm-started tiny default."""
    if cfg.model.path:
        return load_pretrained(cfg.model.path, cfg.model.dtype)
    path = cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"
    if not (path / "config.json").is_file():
        log(f"building the embedded tiny model (cached at {path})")
        model, tokenizer = build_tiny(cfg, env_factory, log)
        save_pretrained(model, tokenizer, path)
    return load_pretrained(path, cfg.model.dtype)


def build_tiny(cfg: Config, env_factory: Callable, log: Callable[[str], None]) -> tuple[Any, Any]:
    """Train the tokenizer, build the tiny model and warm-start it on the env's format."""
    from agentrl.models.tiny import build_model, build_tokenizer
    from agentrl.rollout.demos import ScriptedClient, corpus
    from agentrl.train.warm_start import warm_start

    tokenizer = build_tokenizer(corpus(env_factory, max_turns=cfg.env.max_turns, seed=cfg.seed),
                                cfg.model.tiny.vocab_size)
    model = build_model(cfg.model.tiny, tokenizer, seed=cfg.seed)
    client = ScriptedClient(tokenizer, env_factory)
    collector = RolloutCollector(client.env_factory, make_agent(cfg, tokenizer), client)
    ws = cfg.model.warm_start

    def demos(step: int):
        tasks = make_tasks(cfg.seed, step, ws.batch_size, 1, seed_base=DEMO_SEED_BASE)
        client.reset_entropy()
        return collector.collect(tasks).trajectories, client.reply_entropy

    stats = warm_start(model, demos, ws, tokenizer.pad_token_id, log)
    log(f"warm start done: {stats['steps']} steps, loss {stats['loss']:.4f} (floor {stats['floor']:.4f})")
    return model, tokenizer


# ---------------------------------------------------------------------------- the run
def build_trainer(cfg: Config, run_dir: Path, log: Callable[[str], None] = print) -> Trainer:
    """Build env factory, model, engine, agent, collector, actor and trainer from `cfg`."""
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    check_estimator(cfg)
    env_factory = make_env_factory(cfg)
    model, tokenizer = load_policy(cfg, env_factory, log)
    model.to(device)
    seed_everything(cfg.seed)
    engine_model = copy.deepcopy(model).to(device=device, dtype=DTYPES[cfg.model.dtype])
    engine = LocalEngine.from_config(engine_model, tokenizer, cfg.rollout, seed=cfg.seed)
    collector = RolloutCollector(env_factory, make_agent(cfg, tokenizer), engine)
    horizon = float(cfg.rollout.max_new_tokens * cfg.env.max_turns)  # most tokens an episode generates
    actor = Actor(model, cfg.actor, temperature=cfg.rollout.temperature, horizon=horizon)
    # The reference exists only when a KL term needs it: it costs a model copy and a forward.
    needs_ref = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    reference = (Reference(copy.deepcopy(model), cfg.actor.micro_batch_size, cfg.rollout.temperature)
                 if needs_ref else None)
    critic = None
    if cfg.critic.enable:
        seed_everything(cfg.seed)
        critic = Critic(ValueModel(model).to(device), cfg.critic, horizon)
    env = env_factory()
    baselines = getattr(env, "eval_baselines", None)
    env.close()
    return Trainer(cfg, actor, engine, collector, tokenizer, run_dir, eval_baselines=baselines,
                   reference=reference, critic=critic)


def train(cfg: Config, resume: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run a whole experiment; returns the summary (also written to run_dir/summary.json)."""
    run_dir = cfg.resolved_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    trainer = build_trainer(cfg, run_dir, log)
    return trainer.fit(resume=resume)
