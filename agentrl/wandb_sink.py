"""Weights & Biases as a metrics sink (`trainer.logger=[...,wandb]`), offline unless told otherwise.

The run is written under the run folder (`run_dir/wandb/`, wandb's WANDB_DIR), with the same
metric names as TensorBoard and metrics.jsonl. Nothing here needs a network: the mode is
`offline` unless the environment sets WANDB_MODE (e.g. `online` on a machine that can reach
W&B); upload an offline run later with `wandb sync RUN_DIR/wandb/offline-run-*`. The project is
WANDB_PROJECT or `agentrl`, the run name the experiment's exp_name. A resumed agentrl run writes
under the same W&B run id (kept in `run_dir/wandb/agentrl_run_id`), so a sync joins the pieces.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from agentrl.atomic import write_atomic
from agentrl.errors import ConfigError

RUN_ID_NAME = "agentrl_run_id"
MISSING = ("trainer.logger includes wandb, but wandb is not installed: install the extra wandb "
           "(pip install 'agentrl[wandb]') or drop wandb from trainer.logger")


def check_installed() -> None:
    """One-line ConfigError when wandb cannot be imported (checked before any model is built)."""
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError(MISSING)


def _wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ConfigError(MISSING) from None
    return wandb


class WandbSink:
    """One W&B run that receives every logged row."""

    def __init__(self, run_dir: str | Path, name: str, config: dict[str, Any] | None = None,
                 resume: bool = False) -> None:
        wandb = _wandb()
        folder = Path(run_dir) / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / RUN_ID_NAME
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else secrets.token_hex(4)
        write_atomic(id_file, run_id + "\n")  # a resume reads it back: never half an id
        # console/stats off: the run's own console and metrics already say it, and the stats
        # sampler is a background process per run.
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True)
        # wandb.init replaces sys.exit and sys.excepthook with hooks of its own and never puts them
        # back: a run inside a user's process (agentrl.api.fit) would leave them changed after it.
        self._hooks = (sys.exit, sys.excepthook)
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "agentrl"), name=name, id=run_id,
                               dir=str(Path(run_dir)), mode=os.environ.get("WANDB_MODE", "offline"),
                               config=config or {}, resume="allow" if resume else None, settings=settings,
                               reinit="create_new")
        self._last_step = -1

    def log(self, row: dict[str, Any]) -> None:
        """Send one row ({"step": n, key: value, ...}); W&B's step is the training step."""
        step = int(row["step"])
        if step < self._last_step:  # wandb drops rows that go back in time; a resume never does
            return
        self._last_step = step
        self._run.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        """Finish the W&B run (flushes the offline files)."""
        if self._run is not None:
            try:
                self._run.finish()
            finally:
                self._run = None
                sys.exit, sys.excepthook = self._hooks
