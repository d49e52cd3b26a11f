"""Checkpoints that hold the whole state of a run, written atomically.

A checkpoint is a folder `checkpoints/step_<N>` holding the model in Hugging Face layout
(safetensors), the tokenizer, `optimizer.pt` and `state.pt` (step, policy version, RNG states,
anything else the trainer needs to continue). It is written under a temporary name and renamed
into place, so a process killed mid-write leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.errors import CheckpointError

PREFIX = "step_"


def rng_state() -> dict[str, Any]:
    """The global RNG states of python, numpy and torch."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(ckpt_root: Path, step: int, model, tokenizer, optimizer, state: dict[str, Any],
                    keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and prune all but the newest `keep`."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"{PREFIX}{step:06d}"
    tmp = ckpt_root / f".tmp_{PREFIX}{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"step": step, **state}, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(ckpt_root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def load_state(ckpt: Path) -> dict[str, Any]:
    """Read `state.pt` of a checkpoint."""
    path = ckpt / "state.pt"
    if not path.is_file():
        raise CheckpointError(f"{ckpt} is not a complete checkpoint (no state.pt)")
    return torch.load(path, weights_only=False)


def load_optimizer(ckpt: Path, optimizer) -> None:
    """Restore optimizer state from a checkpoint."""
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False))
