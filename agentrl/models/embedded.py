"""The embedded default model: a tiny Qwen2-class model built and warm-started on this
machine (nothing downloaded), cached by everything it depends on, and its tokenizer folder.

This module owns the cache: where it lives, its key, loading a cached model (a damaged entry is
rebuilt, not blamed on model.path) and the tokenizer folders seed agents load from. How a new
model is built and warm-started is the warm start's recipe (warm_start/recipe.py), handed in as `build`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import Config, to_dict
from agentrl.config.paths import cache_home
from agentrl.errors import ConfigError
from agentrl.models.loading import load_pretrained, save_pretrained
from agentrl.registry import AGENTS, ENVS, Registry, load_builtins
from agentrl.tokenizer import Tokenizer

WARM_START_VERSION = 11  # bump when the warm-start recipe changes, to invalidate cached models


def cache_root(cfg: Config) -> Path:
    """Where warm-started tiny models are cached."""
    return Path(cfg.model.cache_dir).expanduser() if cfg.model.cache_dir else cache_home()


def tiny_cache_key(cfg: Config, tokenizer: Tokenizer | None = None) -> str:
    """Hash of everything the warm-started tiny model depends on (a user-given tokenizer too).

    Env and agent args are hashed with their constructors' defaults filled in: a config that
    spells out a default (configs/frozen_lake.yaml) shares the warm start of one that leaves it out.
    """
    load_builtins()  # the args hash below fills in the registered constructors' defaults
    tags = list(cfg.env_definitions())
    envs = {t: {**to_dict(cfg.env_definitions()[t]), "agent": None} for t in tags}
    agents = {t: to_dict(cfg.agent_for(t)) for t in tags}
    for t in tags:
        envs[t]["args"] = effective_args(ENVS, envs[t]["type"], envs[t]["args"])
        agents[t]["args"] = effective_args(AGENTS, agents[t]["type"], agents[t]["args"])
    warm = to_dict(cfg.model.warm_start)
    if not warm["demo_pool"]:
        del warm["demo_pool"]  # the default plays as before the field existed: keep those models' keys
    parts = {"v": WARM_START_VERSION, "tiny": to_dict(cfg.model.tiny), "warm": warm,
             "envs": envs, "agents": agents, "plan": cfg.group_tags("train"),
             "imports": cfg.imports, "seed": cfg.seed, "max_new_tokens": cfg.rollout.max_new_tokens,
             "budget": [cfg.rollout.max_episode_tokens, cfg.rollout.max_model_len],
             "threads": cfg.runtime.num_threads}  # CPU sums split by thread count: other weights
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


def load_embedded(path: Path, dtype: str, build: Callable[[Path], tuple[Any, Tokenizer]], log: Callable[[str], None],
                  tokenizer: Tokenizer | None = None) -> tuple[Any, Tokenizer]:
    """(model, tokenizer) of the embedded default, in `dtype`: the one cached at `path` (the run
    plan's warm_start_cache: `cache_root(cfg) / f"tiny-{tiny_cache_key(cfg)}"`), else
    `build(tokenizer_dir)`'s, saved there first; the tokenizer's `name_or_path` is a tokenizer
    folder (for seed agents' `tokenizer_path`); a given `tokenizer` replaces the built one."""
    tokenizer_dir = path.with_name(f"{path.name}.tokenizer")
    model, stale = None, path.exists()  # stale: a folder there that does not load (an entry written later is kept)
    if (path / "config.json").is_file():
        try:
            model, loaded = load_pretrained(path, dtype)
        except ConfigError as e:  # a damaged cache entry is rebuilt, not blamed on model.path
            reason = str(e).split("': ", 1)[-1]
            log(f"warning: the cached tiny model at {path} does not load ({reason}); rebuilding it")
    if model is None:
        log(f"building the embedded tiny model (cached at {path})")
        model, built = build(tokenizer_dir)
        publish(save_pretrained(model, built, unique_sibling(path, "new")), path, replace=stale)
        model, loaded = load_pretrained(path, dtype)
    if tokenizer is None:  # the model folder's config.json could make AutoTokenizer pick another class
        return model, tokenizer_folder(loaded, tokenizer_dir, keep_own=False)
    return model, tokenizer_folder(check_tokenizer(tokenizer, model), tokenizer_dir)


def tokenizer_folder(tokenizer: Tokenizer, folder: Path, keep_own: bool = True) -> Tokenizer:
    """Give `tokenizer` a folder holding only the tokenizer (AutoTokenizer.from_pretrained then
    keeps the file's pipeline exactly; a model folder's config.json could make it pick another
    class), a folder `AutoTokenizer.from_pretrained` loads (saved there once) unless
    `keep_own` and its `name_or_path` already is one; returns the tokenizer."""
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    if keep_own and name and Path(name).is_dir():
        return tokenizer
    if not (folder / "tokenizer_config.json").is_file():
        tmp = unique_sibling(folder, "tmp")  # this process's own: another may be writing the same folder
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process wrote it first: theirs is the same tokenizer
            shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.name_or_path = str(folder)
    return tokenizer


def unique_sibling(path: Path, what: str) -> Path:
    """A new name beside `path` that no other process or call uses (for staging a folder)."""
    return path.with_name(f"{path.name}.{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def publish(staged: Path, path: Path, replace: bool) -> None:
    """Move the model folder `staged` to the cache entry `path` in one rename. Several processes
    may build one entry at once (the test suite's workers share a cache): the first to arrive is
    kept, as the key names all the model depends on; a damaged entry (`replace`) is swapped out."""
    if replace:
        old = unique_sibling(path, "old")
        try:
            path.rename(old)
        except FileNotFoundError:  # another process is replacing it too
            pass
        shutil.rmtree(old, ignore_errors=True)
    try:
        staged.rename(path)
    except OSError:  # an entry is there already (rename does not replace a folder that holds files)
        shutil.rmtree(staged, ignore_errors=True)


def fingerprint(tokenizer: Tokenizer) -> str:
    """A short hash of a tokenizer's vocabulary, special tokens and chat template (cache keys)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    text += repr(getattr(tokenizer, "chat_template", None)) + repr(tokenizer.all_special_tokens)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_tokenizer(tokenizer: Tokenizer, model: Any) -> Tokenizer:
    """A user-given tokenizer must fit the model's embedding; pad falls back to EOS."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ConfigError(f"tokenizer= has {len(tokenizer)} tokens but the model's embedding has {rows} rows; "
                          "pass the tokenizer of model.path (or none)")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError("tokenizer= has no chat template; agents need one (set tokenizer.chat_template)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
