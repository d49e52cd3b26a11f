"""Checkpoints that hold the whole state of a run, written atomically.

A checkpoint is a folder `checkpoints/step_<N>` holding the model in Hugging Face layout
(safetensors; with LoRA the adapter alone, as peft saves it: `adapter_model.safetensors` and
`adapter_config.json`, which `PeftModel.from_pretrained(base, folder)` loads), the tokenizer,
`optimizer.pt` and `state.pt` (step, policy version, RNG states, anything else the trainer needs
to continue). It is written under a temporary name and renamed
into place, so a process killed mid-write leaves the previous checkpoint as the latest one.
A write that fails (a full disk: torch and safetensors report it as RuntimeErrors, not always
as OSError) is one CheckpointError naming the folder, the free space and the size needed.

Each checkpoint ends with `manifest.json`: the sha256 and size of every file in it, so that a
file changed after it was written (flipped bytes, an edit, a truncation) is found before it
loads; and `run_config.yaml`, the run's config when it was written, which a resume is compared
with (runtime/run_folder.py). Checkpoints are ordered by step; a reader takes the newest one
whose files all verify and load, so a checkpoint damaged after the fact costs the steps since
the one before it (said in a warning); one without its manifest counts as damaged.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from agentrl.config import Config, save_config
from agentrl.errors import CheckpointError
from agentrl.models.lora import ADAPTER_WEIGHTS
from agentrl.tokenizer import Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PREFIX = "step_"
MANIFEST = "manifest.json"  # sha256 and size of every other file of a checkpoint
RUN_CONFIG = "run_config.yaml"  # the run's config when the checkpoint was written


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


def save_checkpoint(ckpt_root: Path, step: int, model: torch.nn.Module, tokenizer: Tokenizer | None,
                    optimizer: torch.optim.Optimizer, state: dict[str, Any],
                    keep: int = 2, config: Config | None = None) -> Path:
    """Write checkpoint `step` atomically (with its manifest, and `config` as run_config.yaml)
    and prune all but the newest `keep` of this run's steps.

    A failed write (disk full) or an interrupt removes the partial folder and leaves every
    earlier checkpoint as it was; a failed write is a one-line CheckpointError.
    """
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"{PREFIX}{step:06d}"
    tmp = ckpt_root / f".tmp_{PREFIX}{step:06d}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        # a transformers model, or peft's PeftModel (the adapter alone): save_pretrained takes the same arguments
        cast("PreTrainedModel", model).save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"step": step, **state}, tmp / "state.pt")
        if config is not None:
            save_config(config, tmp / RUN_CONFIG)
        write_manifest(tmp, step)
    except Exception as e:  # noqa: BLE001 (a full disk surfaces as OSError, RuntimeError or SafetensorError)
        written = _folder_bytes(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failure(ckpt_root, step, e, written)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        discard(final)
    tmp.rename(final)
    # Prune by step, never by name across runs: checkpoints past this step belong to a timeline
    # this run left (resumed from an earlier one), and only this run's newest `keep` stay.
    older = [p for p in list_checkpoints(ckpt_root) if step_of(p) < step]
    newer = [p for p in list_checkpoints(ckpt_root) if step_of(p) > step]
    for old in older[:max(0, len(older) - (keep - 1))] + newer:
        discard(old)
    return final


def discard(ckpt: Path) -> None:
    """Delete a checkpoint folder; it leaves the listing at once, whole (renamed first), so that a
    reader holding it (checkpoint_hold.py) never sees it with some files gone."""
    gone = ckpt.with_name(f".old_{ckpt.name}")
    try:
        ckpt.rename(gone)
    except OSError:
        gone = ckpt
    shutil.rmtree(gone, ignore_errors=True)


def _write_failure(ckpt_root: Path, step: int, e: Exception, written: int) -> str:
    """One line: which checkpoint could not be written where, why, and what is left."""
    kept = latest_checkpoint(ckpt_root)
    left = f"the previous checkpoint {kept.name} is intact" if kept else "no earlier checkpoint exists"
    why = e.strerror if isinstance(e, OSError) and e.strerror else (str(e).strip().splitlines() or [""])[0]
    try:
        free = shutil.disk_usage(ckpt_root).free
    except OSError:
        free = None
    need = _folder_bytes(kept) if kept else written
    space = "" if free is None else f"; {_mb(free)} free there"
    if free is not None and need:
        space += f", a checkpoint needs about {_mb(need)}"
    return (f"could not write checkpoint step {step} in {ckpt_root}: {type(e).__name__}: {why}{space}; {left}; "
            f"free some space and continue with `agentrl resume {ckpt_root.parent}`")


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _folder_bytes(folder: Path) -> int:
    """Bytes of the files in a folder (0 when it is gone)."""
    try:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    except OSError:
        return 0


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, step: int) -> None:
    """Record the sha256 and size of every file of a checkpoint folder in its manifest."""
    files = {p.relative_to(folder).as_posix(): {"sha256": file_sha256(p), "bytes": p.stat().st_size}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1))


def verify_checkpoint(ckpt: Path, names: tuple[str, ...] | None = None) -> None:
    """Check the files of a checkpoint (or only `names`) against its manifest: a CheckpointError
    naming the first file that is missing or changed since it was written, or the manifest itself."""
    path = ckpt / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"checkpoint {ckpt}: its {MANIFEST} is missing (every checkpoint is written with one)")
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: its {MANIFEST} is unreadable ({type(e).__name__})") from None
    for name, want in files.items():
        if names is not None and name not in names:
            continue
        f = ckpt / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {ckpt}: {name} is missing")
        if f.stat().st_size != want.get("bytes") or file_sha256(f) != want.get("sha256"):
            raise CheckpointError(f"checkpoint {ckpt}: {name} does not match the sha256 recorded when it was "
                                  "written (changed or damaged since)")


def saved_config(ckpt: Path) -> Path | None:
    """The run's config saved with a checkpoint (checked against its manifest), or None for
    checkpoints written before configs were kept with them."""
    path = ckpt / RUN_CONFIG
    if not path.is_file():
        return None
    verify_checkpoint(ckpt, (RUN_CONFIG,))
    return path


def step_of(ckpt: Path) -> int:
    """The step a checkpoint folder's name says."""
    return int(ckpt.name[len(PREFIX):])


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest step first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=step_of)


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def remove_partial(ckpt_root: Path) -> None:
    """Delete the `.tmp_step_N` folders of writes that were cut off (and `.old_step_N` of deletions)."""
    if ckpt_root.is_dir():
        for pattern in (f".tmp_{PREFIX}*", f".old_{PREFIX}*"):
            for p in ckpt_root.glob(pattern):
                shutil.rmtree(p, ignore_errors=True)


def read_checkpoint(ckpt: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(weights, optimizer state, state) of a checkpoint; a CheckpointError when any file fails its
    checksum or is unreadable."""
    from safetensors.torch import load_file

    verify_checkpoint(ckpt)
    try:
        adapter = ckpt / ADAPTER_WEIGHTS
        weights = load_file(str(adapter if adapter.is_file() else ckpt / "model.safetensors"))
        optimizer = torch.load(ckpt / "optimizer.pt", weights_only=False)
        state = torch.load(ckpt / "state.pt", weights_only=False)
    except Exception as e:  # truncated or missing files raise many types (SafetensorError, RuntimeError, EOFError)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"checkpoint {ckpt} is unreadable: {type(e).__name__}: {first}") from None
    return weights, optimizer, state


def newest_readable(ckpt_root: Path, warn) -> tuple[Path, tuple] | None:
    """The newest checkpoint whose files all load, and what `read_checkpoint` read from it.

    Unreadable newer ones are skipped with a one-line warning through `warn`; None when there is
    no checkpoint; a CheckpointError when there are some and none loads.
    """
    found = list_checkpoints(ckpt_root)
    first_error = None
    for ckpt in reversed(found):
        try:
            return ckpt, read_checkpoint(ckpt)
        except CheckpointError as e:
            first_error = first_error or e
            warn(f"warning: {e}; falling back to an older checkpoint")
    if first_error is not None:
        raise CheckpointError(f"no checkpoint in {ckpt_root} loads (newest: {first_error}); "
                              "start over with `agentrl train ... --overwrite`")
    return None


def load_state(ckpt: Path) -> dict[str, Any]:
    """Read `state.pt` of a checkpoint."""
    path = ckpt / "state.pt"
    if not path.is_file():
        raise CheckpointError(f"{ckpt} is not a complete checkpoint (no state.pt)")
    return torch.load(path, weights_only=False)


def load_optimizer(ckpt: Path, optimizer) -> None:
    """Restore optimizer state from a checkpoint."""
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False))
