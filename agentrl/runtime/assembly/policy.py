"""The policy model of a run, built after every model-free check (preflight.py), in one call: a
local Hugging Face model (model.path), or the embedded default, cached or warm-started by its own
room (warm_start/recipe.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.models.embedded import check_tokenizer, fingerprint, tokenizer_folder
from agentrl.models.loading import load_pretrained
from agentrl.runtime.assembly.envs import check_templates
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.process import pin_threads
from agentrl.tokenizer import Tokenizer
from agentrl.warm_start.recipe import embedded_policy


def build_policy(run_plan: RunPlan, log: Callable[[str], None], tokenizer: Tokenizer | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the run whose plan (every model-free check passed) is `run_plan`;
    from here on this process computes with the run's torch threads (the warm start included)."""
    pin_threads(run_plan.runtime.num_threads)
    model, tokenizer = load_policy(run_plan, log, tokenizer)
    check_templates(run_plan, tokenizer)
    return model, tokenizer


def model_context(model: Any) -> int:
    """The longest sequence the model takes."""
    return int(getattr(model.config, "max_position_embeddings", 4096))


def model_vocab(model: Any) -> int:
    """The number of token ids the model embeds (what the engine samples from)."""
    return int(model.config.get_text_config().vocab_size)


def load_policy(run_plan: RunPlan, log: Callable[[str], None], tokenizer: Tokenizer | None = None) -> tuple[Any, Any]:
    """(model, tokenizer): from model.path, or the cached / freshly warm-started tiny default
    (whose tokenizer's `name_or_path` is a tokenizer folder, for seed agents' `tokenizer_path`);
    a given `tokenizer` replaces the folder's (and the tiny default is built on it). The plan's
    envs demonstrate the warm start."""
    m = run_plan.model
    if m.path:
        model, loaded = load_pretrained(m.path, m.dtype)
        if tokenizer is None:
            return model, loaded
        folder = Path(run_plan.cache_dir) / f"tokenizer-{fingerprint(tokenizer)}"  # a tokenizer held in memory only
        return model, tokenizer_folder(check_tokenizer(tokenizer, model), folder)
    return embedded_policy(run_plan, log, tokenizer)
