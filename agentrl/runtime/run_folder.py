"""The run folder as a resource: checked before any model is built, locked while a run writes it,
never silently mixed with another run, and changed on resume only in ways that keep its meaning.

    check_folder  - run_dir / output_dir usable (a folder, writable), one line otherwise
    RunLock       - exclusive fcntl lock on run_dir/.lock (the kernel drops it when the process dies)
    look          - what the folder holds, read once: its checkpoints, step, config and summary
    prepare_fresh - refuse to train into a folder holding a run, or clear it with --overwrite
    resume_changes - the config fields an override changes, refusing the ones that change the run
    finished_summary - the summary of a run that has nothing left to do
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from agentrl.config import Config, load_config, to_dict
from agentrl.errors import AgentRLError, CheckpointError, ConfigError
from agentrl.train.checkpoint import list_checkpoints, read_checkpoint, saved_config, step_of

RESUMES_NAME, LOCK_NAME = "resumes.jsonl", ".lock"
# What a run leaves in its folder; --overwrite removes these (and nothing a user put there).
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "summary.json", "samples.jsonl", "errors.jsonl", "tensorboard",
               "curves.png", RESUMES_NAME, "dumps", "view.html", "wandb", ".weight_sync",
               "scale.json")  # scale.json: a Ray run's scale request (runtime/ray/scale_file.py)
# Fields a resume may change: how long, how often to save / evaluate / log, where, how episodes
# are guarded. Every other field changes what the run means (data, model, objective, seeds).
RESUMABLE = ("trainer.total_steps", "trainer.test_freq", "trainer.save_freq", "trainer.max_checkpoints",
             "trainer.eval_episodes", "trainer.logger", "trainer.progress", "rollout.episode_timeout",
             "rollout.max_retries", "rollout.max_failed_fraction", "device", "model.cache_dir", "run_dir",
             "output_dir", "exp_name", "trainer.dump_trajectories_freq", "trainer.dump_max_tokens",
             "trainer.on_collapse", "health", "runtime")  # runtime: where the parts run, not what the run means


class RunFolderError(AgentRLError):
    """The run folder is unusable, in use, or holds another run."""


def check_folder(cfg: Config) -> Path:
    """The run folder, created if needed; one-line errors when it is a file or not writable."""
    run_dir = cfg.resolved_run_dir()
    field = "run_dir" if cfg.run_dir else "output_dir"
    shown = f"run_dir={cfg.run_dir}" if cfg.run_dir else f"output_dir={cfg.output_dir} (run folder {run_dir})"
    for p in [run_dir, *run_dir.parents]:
        if p.exists():
            if not p.is_dir():
                what = "run_dir" if p == run_dir and cfg.run_dir else f"{p}"
                raise ConfigError(f"{shown}: {what} is a file, not a folder; set {field} to a folder")
            break
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{shown}: cannot create the run folder: {e.strerror or e}") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"{shown}: the run folder is not writable; set {field} to a folder you can write")
    return run_dir


class RunLock:
    """Exclusive lock on a run folder while a run writes it (a crashed process never leaves it held)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"run_dir={self.path.parent} is not writable: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderError(f"run_dir {self.path.parent} is in use by another agentrl process (pid {pid}); "
                                 "wait for it to end or pick another run_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock; the file stays (removing it would race)
            self._fd = None


@dataclasses.dataclass(frozen=True)
class FolderLook:
    """What a run folder holds, read once (`look`) before a run starts or resumes in it."""

    run_dir: Path
    checkpoints: tuple[Path, ...]  # its complete checkpoints, oldest step first
    step: int | None  # the step of the run it holds (its newest checkpoint, 0 without one); None: no run
    # The config the run was trained with: the newest checkpoint's copy that verifies, else
    # run_dir/config.yaml (a run without a checkpoint yet), else None; and where it was read
    run_config: Path | None
    run_config_source: str
    summary: dict[str, Any] | None  # summary.json when it reads as an object


def look(run_dir: Path) -> FolderLook:
    """Read what the run folder holds: its checkpoints, the run's step, config and summary."""
    found = tuple(list_checkpoints(run_dir / "checkpoints"))
    metrics = run_dir / "metrics.jsonl"
    step = step_of(found[-1]) if found else (0 if metrics.is_file() and metrics.stat().st_size > 0 else None)
    config, source = _run_config(run_dir, found)
    summary = None
    with contextlib.suppress(ValueError, OSError):
        read = json.loads((run_dir / "summary.json").read_text())
        summary = read if isinstance(read, dict) else None
    return FolderLook(run_dir, found, step, config, source, summary)


def prepare_fresh(folder: FolderLook, overwrite: bool) -> None:
    """Before a new run: refuse a folder that holds one, or (overwrite) remove that run's outputs."""
    run_dir, step = folder.run_dir, folder.step
    if step is None:
        return
    if not overwrite:
        at = f"step {step}" if step else "no checkpoint yet"
        raise RunFolderError(f"run_dir {run_dir} already holds a run ({at}); use `agentrl resume {run_dir}` "
                             "to continue it, pick another run_dir, or pass --overwrite to start over")
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_changes(cfg: Config, folder: FolderLook) -> dict[str, list[Any]]:
    """{field: [old, new]} of the resumable fields `cfg` changes; refuses any other change.

    The run's config is the one saved with its newest checkpoint (run_config.yaml, checked against
    the checkpoint's manifest), so an edit of run_dir/config.yaml counts as a change; a run without
    such a copy compares with run_dir/config.yaml."""
    saved, source, step = folder.run_config, folder.run_config_source, folder.step or 0
    if saved is None:
        return {}
    old = _flat(to_dict(load_config(saved, [f"run_dir={cfg.run_dir}"] if cfg.run_dir else [])))
    new = _flat(to_dict(cfg))
    changes = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
    refused = [k for k in changes if not any(k == r or k.startswith(r + ".") for r in RESUMABLE)]
    if refused:
        k = refused[0]
        more = f" (and {len(refused) - 1} more: {', '.join(refused[1:4])})" if len(refused) > 1 else ""
        raise RunFolderError(f"resume cannot change {k} (the run has {changes[k][0]!r} in {source}, the config to "
                             f"resume gives {changes[k][1]!r}){more}: it changes what the run means; fields a resume "
                             f"may change: {', '.join(RESUMABLE)}. Start a new run for the other changes")
    if cfg.trainer.total_steps < step:
        raise RunFolderError(f"trainer.total_steps={cfg.trainer.total_steps} is below the run's step {step}; "
                             f"a resume can only keep or raise it")
    return changes


def _run_config(run_dir: Path, checkpoints: tuple[Path, ...]) -> tuple[Path | None, str]:
    """The config the run was trained with, and where it was read: the newest checkpoint's copy
    that verifies, else run_dir/config.yaml, else None."""
    for ckpt in reversed(checkpoints):
        try:
            path = saved_config(ckpt)
        except CheckpointError:
            continue  # a damaged checkpoint: the resume falls back past it too
        if path is not None:
            return path, f"checkpoints/{ckpt.name}/{path.name}"
    saved = run_dir / "config.yaml"
    return (saved, "config.yaml") if saved.is_file() else (None, "")


def record_resume(run_dir: Path, step: int, changes: dict[str, list[Any]]) -> None:
    """Append one line to run_dir/resumes.jsonl: when, from which step, which fields changed."""
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": step, "changes": changes}
    with open(run_dir / RESUMES_NAME, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def finished_summary(cfg: Config, folder: FolderLook) -> dict[str, Any] | None:
    """The summary of a run that already reached trainer.total_steps (None when there is work left)."""
    summary, found = folder.summary, folder.checkpoints
    if summary is None or not found:
        return None
    if not (summary.get("steps") == step_of(found[-1]) >= cfg.trainer.total_steps):
        return None
    try:
        read_checkpoint(found[-1])  # a corrupt final checkpoint leaves work to redo
    except CheckpointError:
        return None
    return summary
