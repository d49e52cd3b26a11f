"""Load and save policy checkpoints in Hugging Face layout from local folders only."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from agentrl.errors import ConfigError
from agentrl.hub import offline
from agentrl.tokenizer import Tokenizer

offline()  # never reach for a hub: paths are local folders (also for callers that are no entry point)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class _SavesPretrained(Protocol):
    """A model that writes itself in Hugging Face layout (a transformers or peft model)."""

    def save_pretrained(self, save_directory: str | os.PathLike[str], *, safe_serialization: bool = ...) -> Any:
        """Write config and weights into `save_directory`."""


def load_pretrained(path: str | Path, dtype: str = "float32") -> tuple[torch.nn.Module, Tokenizer]:
    """Load (model, tokenizer) from a local Hugging Face folder, with one-line errors."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ConfigError(f"model.path={str(path)!r} has no config.json; expected a local Hugging Face model folder")
    try:
        tokenizer = _load_tokenizer(p)
        model = AutoModelForCausalLM.from_pretrained(p, dtype=DTYPES[dtype])
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"could not load model.path={str(path)!r}: {first}") from None
    if tokenizer.pad_token_id is None:  # many base models ship without one; EOS is the usual stand-in
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ConfigError(f"tokenizer at model.path={str(path)!r} has no chat template; agents need one")
    return model, tokenizer


def _load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer saved at `path`, with its tokenizer.json pipeline exactly as written.

    `AutoTokenizer` picks a class from config.json's model type when it can (Qwen2Tokenizer for
    a Qwen2 model), and in transformers 5 that class rebuilds the pre-tokenizer and normalizer
    from its own defaults: a tokenizer saved as a plain `TokenizersBackend` (ours) then splits
    digits differently on load than when the model was trained. Loading such folders with their
    own class keeps the file's pipeline; every other folder goes through `AutoTokenizer`.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg_file = path / "tokenizer_config.json"
    cls_name = json.loads(cfg_file.read_text()).get("tokenizer_class") if cfg_file.is_file() else None
    if cls_name in ("TokenizersBackend", "PreTrainedTokenizerFast") and (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path)
    # A transformers tokenizer is a Tokenizer at run time; its stubs' decode takes and returns wider types.
    return cast(Tokenizer, AutoTokenizer.from_pretrained(path))


def save_pretrained(model: torch.nn.Module, tokenizer: Tokenizer | None, path: str | Path) -> Path:
    """Write model (safetensors) and tokenizer to `path` atomically (temp folder, then rename)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    dst = Path(path)
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    cast(_SavesPretrained, model).save_pretrained(tmp, safe_serialization=True)  # nn.Module's typing lacks it
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    old = dst.with_name(dst.name + ".old")
    if dst.exists():
        dst.rename(old)
    tmp.rename(dst)
    if old.exists():
        shutil.rmtree(old)
    return dst
