"""The local runtime: a run's parts, built by runtime/build/trainer.py, placed in this process: the run
folder checked and locked, the trainer fitted. The run folder protocol is the same for the Ray
runtime (runtime.kind=ray), whose parts `placed` hands to runtime/ray/driver.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentrl.config import Config, save_config
from agentrl.hub import offline
from agentrl.runtime.build.preflight import preflight
from agentrl.runtime.build.trainer import build_trainer
from agentrl.runtime.process import kept_threads
from agentrl.runtime.run_folder import (RunLock, check_folder, finished_summary, prepare_fresh, record_resume,
                                        resume_changes, run_step)
from agentrl.train.checkpoint import remove_partial
from agentrl.train.trainer import Trainer


@contextmanager
def open_run(cfg: Config, resume: bool = False, log: Callable[[str], None] = print, tokenizer: Any = None,
             overwrite: bool = False) -> Iterator[Trainer | dict[str, Any]]:
    """The run folder, checked and locked while the run writes it, and every part built: yields
    the trainer to fit, or the summary of a run that is already finished (resume).

    Every check comes before any model is built. A new run checks its config first (a config
    mistake is the error a user sees, and leaves no folder behind), then refuses a folder that
    holds another run unless `overwrite` (which clears it first). A resume first refuses config
    changes that alter the run's meaning (what such a change breaks is not the error to show),
    then checks the config, and writes config.yaml only once the checkpoint has loaded.
    """
    offline()  # the Python API's runs too: an agent's from_pretrained never waits on the network
    factories = None if resume else preflight(cfg)
    run_dir = check_folder(cfg)
    # The run computes on runtime.num_threads; the caller's own count comes back at the end.
    with RunLock(run_dir), kept_threads():
        remove_partial(run_dir / "checkpoints")
        if resume:
            changes = resume_changes(cfg, run_dir, run_step(run_dir) or 0)
            done = finished_summary(cfg, run_dir)
            if done is not None:  # resuming it again would only append a second final evaluation
                log(f"run {run_dir} is already finished at step {done['steps']} (trainer.total_steps="
                    f"{cfg.trainer.total_steps}); nothing to do: raise trainer.total_steps to train further")
                yield done
                return
            factories = preflight(cfg)
        else:
            prepare_fresh(run_dir, overwrite)
            save_config(cfg, run_dir / "config.yaml")
        with placed(cfg, run_dir, log, tokenizer, factories) as trainer:
            if resume:
                trainer.restore()
                if trainer.step_idx == 0:  # nothing to continue: say so rather than start over silently
                    every = f"every {cfg.trainer.save_freq} steps" if cfg.trainer.save_freq else "at its end"
                    log(f"agentrl: {run_dir} holds no checkpoint to resume from (this run saves one {every}, "
                        "trainer.save_freq); training starts at step 0")
                # Only now is the new config proven to fit the run: write it and record what changed.
                save_config(cfg, run_dir / "config.yaml")
                record_resume(run_dir, trainer.step_idx, changes)
            yield trainer


@contextmanager
def placed(cfg: Config, run_dir: Path, log: Callable[[str], None], tokenizer: Any,
           factories: dict[str, Callable[[], Any]]) -> Iterator[Any]:
    """The trainer of `cfg` (whose preflight gave `factories`): built in this process
    (runtime.kind=local), or its parts placed as Ray actors (runtime.kind=ray, runtime/ray/driver.py: a
    handle with the same fit / restore / step_idx)."""
    if cfg.runtime.kind == "ray":
        from agentrl.runtime.ray.driver import ray_trainer

        with ray_trainer(cfg, run_dir, log, tokenizer, factories) as trainer:
            yield trainer
    else:
        yield build_trainer(cfg, run_dir, log, tokenizer, factories)


def train(cfg: Config, resume: bool = False, log: Callable[[str], None] = print, tokenizer: Any = None,
          overwrite: bool = False) -> dict[str, Any]:
    """Run a whole experiment; returns the summary (also written to run_dir/summary.json)."""
    with open_run(cfg, resume, log, tokenizer, overwrite) as run:
        return run if isinstance(run, dict) else run.fit(resume=resume)
