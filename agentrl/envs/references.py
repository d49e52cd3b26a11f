"""An env's references (a random policy's success, a scripted solver's), computed once per set of
evaluated seeds: evaluation plays the same seeds every time, and a reference costs many episodes."""

from __future__ import annotations

from collections.abc import Callable, Mapping


class PerSeeds:
    """`compute(seeds)` for the seeds of the evaluated trajectories, cached per set of seeds."""

    def __init__(self, compute: Callable[[tuple[int, ...]], Mapping[str, float]]) -> None:
        self.compute = compute
        self._known: dict[tuple[int, ...], dict[str, float]] = {}

    def __call__(self, trajectories: list) -> dict[str, float]:
        """The references on these trajectories' seeds ({} when there are none)."""
        seeds = tuple(sorted(t.env_seed for t in trajectories))
        if not seeds:
            return {}
        if seeds not in self._known:
            self._known[seeds] = dict(self.compute(seeds))
        return dict(self._known[seeds])
