"""The local runtime: build every part from a config and run the loop in this process."""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from agentrl.algos.policy_losses import check_loss_mode
from agentrl.config import Config, save_config, to_dict
from agentrl.envs.service import close_env
from agentrl.errors import ConfigError, RolloutError
from agentrl.llm.local import LocalEngine
from agentrl.models.loading import DTYPES, load_pretrained, save_pretrained
from agentrl.registry import AGENTS, ENVS, Registry
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.source import rollout_source
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.envs import agent_texts, check_templates, is_seed_tag, make_budget, make_tag_specs
from agentrl.runtime.preflight import preflight
from agentrl.runtime.run_folder import (RunLock, check_folder, finished_summary, prepare_fresh, record_resume,
                                        resume_changes, run_step)
from agentrl.runtime.seeds import check_tokenizer, demo_factories, fingerprint, seed_texts, tokenizer_folder
from agentrl.train.actor import Actor, Reference
from agentrl.train.checkpoint import remove_partial
from agentrl.train.critic import Critic, ValueModel
from agentrl.train.trainer import Trainer

WARM_START_VERSION = 6  # bump when the warm-start recipe changes, to invalidate cached models


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


def model_context(model: Any) -> int:
    """The longest sequence the model takes."""
    return int(getattr(model.config, "max_position_embeddings", 4096))


# ---------------------------------------------------------------------------- the model
def cache_root(cfg: Config) -> Path:
    """Where warm-started tiny models are cached."""
    root = cfg.model.cache_dir or os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl"
    return Path(root).expanduser()


def tiny_cache_key(cfg: Config, tokenizer: Any = None) -> str:
    """Hash of everything the warm-started tiny model depends on (a user-given tokenizer too).

    Env and agent args are hashed with their constructors' defaults filled in: a config that
    spells out a default (configs/frozen_lake.yaml) shares the warm start of one that leaves it out.
    """
    tags = list(cfg.env_definitions())
    envs = {t: {**to_dict(cfg.env_definitions()[t]), "agent": None} for t in tags}
    agents = {t: to_dict(cfg.agent_for(t)) for t in tags}
    for t in tags:
        envs[t]["args"] = effective_args(ENVS, envs[t]["type"], envs[t]["args"])
        agents[t]["args"] = effective_args(AGENTS, agents[t]["type"], agents[t]["args"])
    parts = {"v": WARM_START_VERSION, "tiny": to_dict(cfg.model.tiny), "warm": to_dict(cfg.model.warm_start),
             "envs": envs, "agents": agents, "plan": cfg.group_tags("train"),
             "imports": cfg.imports, "seed": cfg.seed, "max_new_tokens": cfg.rollout.max_new_tokens,
             "budget": [cfg.rollout.max_episode_tokens, cfg.rollout.max_model_len]}
    if tokenizer is not None:
        parts["tokenizer"] = fingerprint(tokenizer)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def effective_args(registry: Registry, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """`args` with the defaults of the registered class's constructor filled in (JSON-safe
    defaults only; an unknown name keeps `args` as given)."""
    if name not in registry:
        return dict(args)
    out = {}
    for key, p in inspect.signature(registry.get(name)).parameters.items():
        plain = isinstance(p.default, (str, int, float, bool, type(None)))
        if p.default is not p.empty and plain and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            out[key] = p.default
    return {**out, **args}


def load_policy(cfg: Config, factories: dict[str, Callable], log: Callable[[str], None],
                tokenizer: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer): from model.path, or the cached / freshly warm-started tiny default
    (whose tokenizer's `name_or_path` is a tokenizer folder, for seed agents' `tokenizer_path`);
    a given `tokenizer` replaces the folder's (and the tiny default is built on it)."""
    if cfg.model.path:
        model, loaded = load_pretrained(cfg.model.path, cfg.model.dtype)
        if tokenizer is None:
            return model, loaded
        folder = cache_root(cfg) / f"tokenizer-{fingerprint(tokenizer)}"  # for a tokenizer held in memory only
        return model, tokenizer_folder(check_tokenizer(tokenizer, model), folder)
    key = tiny_cache_key(cfg, tokenizer)
    path = cache_root(cfg) / f"tiny-{key}"
    tokenizer_dir = cache_root(cfg) / f"tiny-{key}.tokenizer"
    model = None
    if (path / "config.json").is_file():
        try:
            model, loaded = load_pretrained(path, cfg.model.dtype)
        except ConfigError as e:  # a damaged cache entry is rebuilt, not blamed on model.path
            reason = str(e).split("': ", 1)[-1]
            log(f"warning: the cached tiny model at {path} does not load ({reason}); rebuilding it")
    if model is None:
        log(f"building the embedded tiny model (cached at {path})")
        model, built = build_tiny(cfg, factories, log, tokenizer, tokenizer_dir)
        save_pretrained(model, built, path)
        model, loaded = load_pretrained(path, cfg.model.dtype)
    if tokenizer is None:  # the model folder's config.json could make AutoTokenizer pick another class
        return model, tokenizer_folder(loaded, tokenizer_dir, keep_own=False)
    return model, tokenizer_folder(check_tokenizer(tokenizer, model), tokenizer_dir)


def build_tiny(cfg: Config, factories: dict[str, Callable], log: Callable[[str], None], tokenizer: Any = None,
               tokenizer_dir: Path | None = None) -> tuple[Any, Any]:
    """Train the tokenizer on every env of the run (unless one is given), build the tiny model and
    warm-start it on demonstrations of every tag that can give them, in the proportions of the
    training batches."""
    from agentrl.models.tiny import build_model, build_tokenizer
    from agentrl.rollout.demos import ScriptedClient, corpus
    from agentrl.train.warm_start import warm_start

    definitions = cfg.env_definitions()

    def texts():
        for tag, make_env in factories.items():
            yield from corpus(make_env, max_turns=definitions[tag].max_turns, seed=cfg.seed,
                              step=not is_seed_tag(cfg, tag))
        yield from agent_texts(cfg)
        yield from seed_texts(cfg)

    if tokenizer is None:
        tokenizer = build_tokenizer(texts(), cfg.model.tiny.vocab_size)
    if tokenizer_dir is not None:
        tokenizer_folder(tokenizer, tokenizer_dir)  # seed agents load theirs from tokenizer_path
    model = build_model(cfg.model.tiny, tokenizer, seed=cfg.seed)
    shown = demo_factories(cfg, factories, log)
    plan = [t for t in cfg.group_tags("train") if t in shown]
    if not plan:
        log("warm start skipped: no env of this run can demonstrate a reply (no sample_action, no dataset answers)")
        return model.eval(), tokenizer
    client = ScriptedClient(tokenizer)
    budget = make_budget(cfg, model_context(model))
    collector = RolloutCollector(make_tag_specs(cfg, tokenizer, shown, budget, wrap=client.wrap), client)
    ws = cfg.model.warm_start
    demo_tags = [plan[i * len(plan) // ws.batch_size] for i in range(ws.batch_size)]  # the batch's mix

    def demos(step: int):
        tasks = TaskSource(cfg.seed, 1, ()).demonstrations(step, demo_tags)
        client.reset_entropy()
        result = collector.collect(tasks)
        if not result.trajectories:  # say why, not "pack() needs at least one trajectory"
            raise RolloutError(f"warm start: all {len(tasks)} demonstration episodes failed; first error: "
                               f"{result.errors[0] if result.errors else 'none recorded'}")
        return result.trajectories, client.reply_entropy

    stats = warm_start(model, demos, ws, tokenizer.pad_token_id, log)
    log(f"warm start done: {stats['steps']} steps, loss {stats['loss']:.4f} (floor {stats['floor']:.4f})")
    return model, tokenizer


# ---------------------------------------------------------------------------- the run
def build_trainer(cfg: Config, run_dir: Path, log: Callable[[str], None] = print, tokenizer: Any = None) -> Trainer:
    """Build env factories, model, engine, agents, collector, actor and trainer from `cfg`
    (with `tokenizer` instead of the model's own when given)."""
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
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


@contextmanager
def open_run(cfg: Config, resume: bool = False, log: Callable[[str], None] = print, tokenizer: Any = None,
             overwrite: bool = False) -> Iterator[Trainer | dict[str, Any]]:
    """The run folder, checked and locked while the run writes it, and every part built: yields
    the trainer to fit, or the summary of a run that is already finished (resume).

    The folder is checked before any model is built. A new run refuses a folder that holds
    another run unless `overwrite` (which clears it first); a resume refuses config changes that
    alter the run's meaning, and writes config.yaml only once the checkpoint has loaded.
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
                yield done
                return
        else:
            prepare_fresh(run_dir, overwrite)
            save_config(cfg, run_dir / "config.yaml")
        trainer = build_trainer(cfg, run_dir, log, tokenizer)
        if resume:
            trainer._restore()
            # Only now is the new config proven to fit the run: write it and record what changed.
            save_config(cfg, run_dir / "config.yaml")
            record_resume(run_dir, trainer.step_idx, changes)
        yield trainer


def train(cfg: Config, resume: bool = False, log: Callable[[str], None] = print, tokenizer: Any = None,
          overwrite: bool = False) -> dict[str, Any]:
    """Run a whole experiment; returns the summary (also written to run_dir/summary.json)."""
    with open_run(cfg, resume, log, tokenizer, overwrite) as run:
        return run if isinstance(run, dict) else run.fit(resume=resume)
