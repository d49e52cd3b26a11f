"""The run handle: what either runtime hands back for a run whose parts are built.

The local runtime's handle is the `Trainer` itself (train/trainer.py), built in this process;
the Ray runtime's is `RayRun` (runtime/ray/driver.py), which asks trainer rank 0, a Ray actor, to do the
same. `open_run` (runtime/local.py) drives either one through these methods alone: resume, then
fit; `agentrl eval` evaluates through `evaluate`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


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
