"""The run handle: what either runtime hands back for a run whose parts are built.

The local runtime's handle is the `Trainer` itself (train/trainer.py), built in this process;
the Ray runtime's is `RayRun` (runtime/ray/driver.py), which asks trainer rank 0, a Ray actor, to do the
same; a run already finished gets a `FinishedRun`. `open_run` (runtime/local.py) drives any of
them through these methods alone: resume, then fit; `agentrl eval` evaluates through `evaluate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentrl.errors import AgentRLError


@runtime_checkable
class RunHandle(Protocol):
    """A run ready to train: resume it, fit it, evaluate its policy."""

    @property
    def step_idx(self) -> int:
        """The last step trained (0 before any)."""

    def resume(self) -> None:
        """Continue from the run folder's newest readable checkpoint (none: stay at step 0)."""

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to trainer.total_steps (resuming first, unless done, when `resume`); the run's summary."""

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on held-out env seeds: the eval/ metrics."""


class FinishedRun:
    """The handle of a run that already reached trainer.total_steps: nothing is built; fitting
    it gives its summary (resuming it again would only add a second final evaluation)."""

    def __init__(self, run_dir: Path, summary: dict[str, Any]) -> None:
        self.run_dir, self.summary = run_dir, summary

    @property
    def step_idx(self) -> int:
        """The step the run finished at."""
        return int(self.summary.get("steps", 0))

    def resume(self) -> None:
        """Nothing to continue."""

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """The run's summary (summary.json)."""
        return self.summary

    def evaluate(self) -> dict[str, float]:
        """Refused in one line: nothing is built for a finished run."""
        raise AgentRLError(f"run {self.run_dir} is finished (step {self.step_idx}): its final evaluation is in "
                           f"summary.json; `agentrl eval {self.run_dir}` evaluates its newest checkpoint again")
