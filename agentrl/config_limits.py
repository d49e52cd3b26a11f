"""Bounds on every number of a config, checked before anything is built from it.

`agentrl.config.validate` calls `check_limits` first: a size is only ever used after it has
been bounded here, so a value like `rollout.batch_size=18446744073709551616` fails in one line
instead of materialising a list of 2^61 group tags or a model of absurd width. The bounds are
generous (far beyond what a run on one machine uses); each message names the field, its value
and the accepted range.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.errors import ConfigError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SEED_MAX = 2**64 - 1  # torch.manual_seed takes 0 .. 2^64-1; numpy gets seed % 2^32

# Upper bounds of the sizes something is built from (lists of tags, episodes, tensors, loops).
SIZE_LIMITS: dict[str, int] = {
    "rollout.batch_size": 2**20,
    "rollout.group_size": 2**20,
    "rollout.max_new_tokens": 2**24,
    "engine.max_num_seqs": 2**20,
    "engine.max_num_batched_tokens": 2**30,
    "engine.max_total_tokens": 2**40,
    "rollout.max_episode_tokens": 2**30,
    "rollout.max_model_len": 2**24,
    "rollout.max_staleness": 2**10,
    "rollout.max_retries": 2**10,
    "actor.ppo_epochs": 2**14,
    "critic.ppo_epochs": 2**14,
    "trainer.total_steps": 1_000_000,  # step seeds stay below the extra-batch stride and the eval step
    "trainer.eval_episodes": 2**20,
    "trainer.max_checkpoints": 2**20,
    "env.max_turns": 2**14,  # per-turn metrics (success_at_k) are built for every turn
    "algorithm.filter_groups.max_num_gen_batches": 2**10,
    "model.tiny.hidden_size": 2**14,
    "model.tiny.num_hidden_layers": 2**8,
    "model.tiny.num_attention_heads": 2**10,
    "model.tiny.num_key_value_heads": 2**10,
    "model.tiny.intermediate_size": 2**16,
    "model.tiny.vocab_size": 2**18,
    "model.tiny.max_position_embeddings": 2**24,
    "model.warm_start.max_steps": 1_000_000,
    "model.warm_start.batch_size": 2**16,
    "model.warm_start.patience": 1_000_000,
    "model.warm_start.min_steps": 1_000_000,
    "model.lora.rank": 2**16,
    "actor.max_tokens_per_micro_batch": 2**30,
    "critic.max_tokens_per_micro_batch": 2**30,
}
MIN_VOCAB = 300  # the tiny tokenizer holds 256 byte symbols, 4 special and 4 tag tokens


def check_limits(cfg: Any) -> None:
    """Raise a one-line ConfigError for an integer out of range or a size beyond its bound."""
    for key, value in _ints(cfg, ""):
        limit = SIZE_LIMITS.get(_generic(key))
        if limit is not None and value > limit:
            raise ConfigError(f"{key}={value} is too large; at most {limit} is accepted")
        lo, hi = (0, SEED_MAX) if key == "seed" else (INT64_MIN, INT64_MAX)
        if not lo <= value <= hi:
            raise ConfigError(f"{key}={value} is out of range; it must be an integer in [{lo}, {hi}]")
    _check_model(cfg)


def _check_model(cfg: Any) -> None:
    """The tiny model's shape and warm start: positive sizes whose heads divide evenly."""
    tiny, ws = cfg.model.tiny, cfg.model.warm_start
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "max_position_embeddings"):
        if getattr(tiny, key) < 1:
            raise ConfigError(f"model.tiny.{key}={getattr(tiny, key)} must be a positive integer")
    if tiny.vocab_size < MIN_VOCAB:
        raise ConfigError(f"model.tiny.vocab_size={tiny.vocab_size} must be at least {MIN_VOCAB} "
                          "(256 byte symbols plus special tokens)")
    if tiny.hidden_size % tiny.num_attention_heads:
        raise ConfigError(f"model.tiny.num_attention_heads={tiny.num_attention_heads} must divide "
                          f"model.tiny.hidden_size={tiny.hidden_size}")
    if (tiny.hidden_size // tiny.num_attention_heads) % 2:
        raise ConfigError(f"model.tiny.hidden_size={tiny.hidden_size} / num_attention_heads="
                          f"{tiny.num_attention_heads} gives an odd head size; rotary embeddings need an even one")
    if tiny.num_attention_heads % tiny.num_key_value_heads:
        raise ConfigError(f"model.tiny.num_key_value_heads={tiny.num_key_value_heads} must divide "
                          f"model.tiny.num_attention_heads={tiny.num_attention_heads}")
    for key in ("batch_size", "patience"):
        if getattr(ws, key) < 1:
            raise ConfigError(f"model.warm_start.{key}={getattr(ws, key)} must be a positive integer")
    for key in ("max_steps", "min_steps"):
        if getattr(ws, key) < 0:
            raise ConfigError(f"model.warm_start.{key}={getattr(ws, key)} must be >= 0")
    for key in ("lr", "floor_tolerance"):
        if getattr(ws, key) < 0:
            raise ConfigError(f"model.warm_start.{key}={getattr(ws, key)} must be >= 0")


def _generic(key: str) -> str:
    """custom_envs.<name>.max_turns is bounded as env.max_turns."""
    if key.startswith("custom_envs.") and key.endswith(".max_turns"):
        return "env.max_turns"
    return key


def _ints(obj: Any, key: str):
    """(dotted key, value) of every int in the config tree (lists and named sections included;
    free-form args are the env's or agent's to check)."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _ints(getattr(obj, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(obj, dict) and not key.endswith("args"):
        for name, value in obj.items():
            if dataclasses.is_dataclass(value):
                yield from _ints(value, f"{key}.{name}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            if isinstance(value, int) and not isinstance(value, bool):
                yield f"{key}[{i}]", value
    elif isinstance(obj, int) and not isinstance(obj, bool):
        yield key, obj
