"""Load and save policy checkpoints in Hugging Face layout from local folders only."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from agentrl.errors import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: paths are local folders
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_pretrained(path: str | Path, dtype: str = "float32"):
    """Load (model, tokenizer) from a local Hugging Face folder, with one-line errors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ConfigError(f"model.path={str(path)!r} has no config.json; expected a local Hugging Face model folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(p)
        model = AutoModelForCausalLM.from_pretrained(p, dtype=DTYPES[dtype])
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"could not load model.path={str(path)!r}: {first}") from None
    if tokenizer.pad_token_id is None:  # many base models ship without one; EOS is the usual stand-in
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ConfigError(f"tokenizer at model.path={str(path)!r} has no chat template; agents need one")
    return model, tokenizer


def save_pretrained(model, tokenizer, path: str | Path) -> Path:
    """Write model (safetensors) and tokenizer to `path` atomically (temp folder, then rename)."""
    dst = Path(path)
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    old = dst.with_name(dst.name + ".old")
    if dst.exists():
        dst.rename(old)
    tmp.rename(dst)
    if old.exists():
        shutil.rmtree(old)
    return dst
