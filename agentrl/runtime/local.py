"""The local runtime: a run's parts, built by runtime/assembly/, placed in this process: the run
folder checked and locked, the plan written and logged, the trainer fitted. The run folder
protocol is the same for the Ray runtime (runtime.kind=ray), whose parts `placed` hands to
runtime/ray/driver.py; either runtime hands back a run handle (runtime/handle.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentrl.config import Config, load_config, save_config
from agentrl.errors import AgentRLError
from agentrl.hub import offline
from agentrl.runtime.assembly.plan import RunPlan, plan, save_plan
from agentrl.runtime.handle import FinishedRun, RunHandle
from agentrl.runtime.process import kept_threads
from agentrl.runtime.run_folder import (
    RunLock,
    check_folder,
    finished_summary,
    look,
    prepare_fresh,
    record_resume,
    resume_changes,
)
from agentrl.tokenizer import Tokenizer
from agentrl.train.checkpoint import remove_partial


@contextmanager
def open_run(cfg: Config, resume: bool = False, log: Callable[[str], None] = print, tokenizer: Tokenizer | None = None,
             overwrite: bool = False) -> Iterator[RunHandle]:
    """The run folder, checked and locked while the run writes it, and every part built: yields
    the run's handle to fit (resumed when `resume`; a `FinishedRun` for a run that is already
    finished).

    Every check comes before any model is built. A new run makes its plan first (a config
    mistake is the error a user sees, and leaves no folder behind), then refuses a folder that
    holds another run unless `overwrite` (which clears it first). A resume first refuses config
    changes that alter the run's meaning (what such a change breaks is not the error to show),
    then makes the plan, and writes config.yaml and plan.json only once the checkpoint has loaded.
    """
    offline()  # the Python API's runs too: an agent's from_pretrained never waits on the network
    run_plan = None if resume else plan(cfg, tokenizer)
    run_dir = check_folder(cfg)
    # The run computes on runtime.num_threads; the caller's own count comes back at the end.
    with RunLock(run_dir), kept_threads():
        remove_partial(run_dir / "checkpoints")
        folder = look(run_dir)  # what the folder holds, read once
        if resume:
            changes = resume_changes(cfg, folder)
            done = finished_summary(cfg, folder)
            if done is not None:  # resuming it again would only append a second final evaluation
                log(f"run {run_dir} is already finished at step {done['steps']} (trainer.total_steps="
                    f"{cfg.trainer.total_steps}); nothing to do: raise trainer.total_steps to train further")
                yield FinishedRun(run_dir, done)
                return
            run_plan = plan(cfg, tokenizer)
        else:
            assert run_plan is not None  # a new run is planned above, before the folder is touched
            prepare_fresh(folder, overwrite)
            save_config(cfg, run_dir / "config.yaml")
            save_plan(run_plan, run_dir)
        log(run_plan.describe())
        with placed(cfg, run_dir, log, tokenizer, run_plan) as run:
            if resume:
                run.resume()
                if run.step_idx == 0:  # nothing to continue: say so rather than start over silently
                    every = f"every {cfg.trainer.save_freq} steps" if cfg.trainer.save_freq else "at its end"
                    log(f"agentrl: {run_dir} holds no checkpoint to resume from (this run saves one {every}, "
                        "trainer.save_freq); training starts at step 0")
                # Only now is the new config proven to fit the run: write it and record what changed.
                save_config(cfg, run_dir / "config.yaml")
                save_plan(run_plan, run_dir)
                record_resume(run_dir, run.step_idx, changes)
            yield run


@contextmanager
def placed(cfg: Config, run_dir: Path, log: Callable[[str], None], tokenizer: Tokenizer | None,
           run_plan: RunPlan) -> Iterator[RunHandle]:
    """The run handle of `cfg` (whose plan is `run_plan`): the trainer built in this process
    (runtime.kind=local), or the handle on its parts placed as Ray actors (runtime.kind=ray,
    runtime/ray/driver.py)."""
    if cfg.runtime.kind == "ray":
        from agentrl.runtime.ray.driver import ray_trainer

        try:
            with ray_trainer(cfg, run_dir, log, tokenizer, run_plan) as run:
                yield run
        finally:  # the driver's own (its warm start's); the env managers' end with their processes
            close_mcp_servers()
    else:
        # Imported here, as in `evaluate_checkpoint`: the parts pull in transformers' model stack
        # (seconds of CPU), which a run refused before any model (its config, its folder) never needs.
        from agentrl.runtime.assembly.trainer import build_trainer

        trainer = build_trainer(cfg, run_dir, log, tokenizer, run_plan)
        try:
            yield trainer
        finally:  # the run is over, or died: what its engine started stops (vLLM servers)
            trainer.rollout.shutdown()
            close_mcp_servers()


def train(cfg: Config, resume: bool = False, log: Callable[[str], None] = print, tokenizer: Tokenizer | None = None,
          overwrite: bool = False) -> dict[str, Any]:
    """Run a whole experiment (or continue it: `resume`); returns the summary (also written to
    run_dir/summary.json)."""
    with open_run(cfg, resume, log, tokenizer, overwrite) as run:
        return run.fit()


def evaluate_checkpoint(run_dir: Path, overrides: list[str], log: Callable[[str], None] = print
                        ) -> tuple[Path, dict[str, float]]:
    """(the checkpoint, its eval/ metrics): the newest checkpoint of `run_dir` that loads (a
    corrupt newer one is skipped), evaluated with the run's config and `overrides`; held while it
    is evaluated, so a trainer still writing the run may prune it meanwhile."""
    from agentrl.models.lora import is_adapter_folder
    from agentrl.runtime.assembly.trainer import build_trainer
    from agentrl.train.actor import Actor
    from agentrl.train.checkpoint_hold import held_newest

    with held_newest(run_dir / "checkpoints", warn=log) as found:
        if found is None:
            raise AgentRLError(f"no checkpoint in {run_dir / 'checkpoints'}; train first or check the folder")
        ckpt, held, (weights, _, state) = found
        adapter = is_adapter_folder(held)  # LoRA: the run's own base model, the checkpoint's adapter
        cfg = load_config(run_dir / "config.yaml", [*overrides, *([] if adapter else [f"model.path={held}"])])
        trainer = build_trainer(cfg, run_dir, log=log)
        try:
            if adapter:
                actor = trainer.actor
                # build_trainer builds this process's Actor; loading weights is not in the Learner protocol
                assert isinstance(actor, Actor)
                actor.load_weights(weights)
                trainer.sync()
            trainer.step_idx = int(state["step"])  # samples.jsonl rows carry the checkpoint's step
            return ckpt, trainer.evaluate()
        finally:
            trainer.rollout.shutdown()
            close_mcp_servers()


def close_mcp_servers() -> None:
    """Stop the MCP servers the run's agents started (agent.args.mcp_servers), if any."""
    mcp = sys.modules.get("agentrl.tools.mcp")  # never imported: none was started
    if mcp is not None:
        mcp.close_servers()
