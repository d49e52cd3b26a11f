"""Where the trainer gets its episodes: a step's groups, an evaluation, a weight push, and the
state a checkpoint needs. The trainer holds one `RolloutSource` and never asks which it is.

- `OnPolicySource` (rollout.max_staleness=0): each step's groups are played after the previous
  update, by the weights it produced; the engine lives in the trainer's thread.
- `StreamSource` (max_staleness=k >= 1): groups are played ahead in a background thread by a
  policy at most k versions old (rollout/stream.py); the engine lives in that thread, so every
  engine call goes there.

Both fill a step the same way (`fill_step`): generation batches until the step has its groups,
each batch passed through the group filter the trainer gives (DAPO's), at most `max_batches`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.llm.engine import InferenceEngine
from agentrl.rollout.collector import CollectResult, RolloutCollector
from agentrl.rollout.filters import Groups, groups_of, split_greedy_baselines
from agentrl.rollout.stream import RolloutStream
from agentrl.rollout.tasks import TaskSource

GroupFilter = Callable[[Groups], Groups]


@dataclass
class StepRollout:
    """The groups a step trains on, the counts and errors of every episode played for it, and
    rollout/* metrics of how it was filled."""

    groups: Groups
    result: CollectResult  # every generation batch's counts (its trajectories: the kept groups')
    stats: dict[str, float] = field(default_factory=dict)


class RolloutSource(Protocol):
    """What the trainer asks for episodes, and how it keeps the engine in step with training."""

    tasks: TaskSource

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine serves."""
        ...

    def start(self) -> None:
        """Begin producing training groups (after the first evaluation)."""
        ...

    def collect(self, step: int, version: int, keep: GroupFilter | None = None, max_batches: int = 1) -> StepRollout:
        """The groups of training step `step` for a policy at `version`, filtered by `keep`."""
        ...

    def evaluate(self) -> CollectResult:
        """Play the evaluation tasks; the engine is left as it was found (no cached prefix, no
        counters from it), so a step after it does not depend on whether it ran."""
        ...

    def load_weights(self, weights: dict[str, Any]) -> int:
        """Push new policy weights to the engine; returns its new policy version."""
        ...

    def pop_metrics(self) -> dict[str, float]:
        """The engine's perf/engine_* counters since the last call."""
        ...

    def checkpoint(self) -> dict[str, Any]:
        """What a resumed run needs (engine state, stream position); drops cached prefixes
        first, so the engine continues from the state a resumed one starts in."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from what `checkpoint` returned (before `start`)."""
        ...

    def close(self) -> None:
        """Stop producing; release the background thread if there is one."""
        ...

    def shutdown(self) -> None:
        """The run is over: close, then close the engine (servers the run started stop)."""
        ...


def fill_step(next_batch: Callable[[int], tuple[Groups, CollectResult, int]], need: int,
              keep: GroupFilter | None, max_batches: int,
              on_dropped: Callable[[int], None] = lambda n: None,
              on_played: Callable[[Groups], None] = lambda groups: None,
              version: int | None = None) -> StepRollout:
    """Generation batches (`next_batch(attempt)` -> complete groups, counts, too-stale groups)
    until `need` groups pass `keep`; `on_dropped(n)` hears of groups the filter dropped,
    `on_played(groups)` of every batch's groups before the filter (a curriculum's estimates).
    The ids of groups the filter dropped, or played beyond `need`, count as discarded (filtered);
    `version`: the policy version the step trains (for the result's staleness metrics)."""
    kept: Groups = []
    total = CollectResult([])
    dropped = stale = 0
    for attempt in range(max(1, max_batches)):
        groups, result, n_stale = next_batch(attempt)
        groups = split_greedy_baselines(groups)  # ReMax's greedy episodes are baselines, not samples
        on_played(groups)
        total.absorb(result)
        stale += n_stale
        informative = keep(groups) if keep is not None else groups
        dropped += len(groups) - len(informative)
        on_dropped(len(groups) - len(informative))
        total.discard("filtered", group_ids(groups) - group_ids(informative))
        kept += informative
        if len(kept) >= need:
            break
    total.discard("filtered", group_ids(kept[need:]))
    kept = kept[:need]
    total.trajectories = [t for g in kept for t in g]
    total.handed_ids, total.trained_version = group_ids(kept), version
    return StepRollout(kept, total, {"rollout/gen_batches": float(attempt + 1),
                                     "rollout/filtered_groups_equal": float(dropped),
                                     "rollout/stale_dropped_groups": float(stale)})


def group_ids(groups: Groups) -> int:
    """Generated ids of every trajectory of `groups`."""
    return sum(t.num_generated for g in groups for t in g)


def engine_discarded(engine: InferenceEngine) -> int:
    """Ids the engine decoded for requests whose caller stopped waiting, since the last call
    (0 for an engine that does not count them)."""
    pop = getattr(engine, "pop_discarded_tokens", None)
    return int(pop()) if callable(pop) else 0


class OnPolicySource:
    """Each step's groups are played by the current weights, in the caller's thread."""

    def __init__(self, collector: RolloutCollector, engine: InferenceEngine, tasks: TaskSource) -> None:
        self.collector = collector
        self.engine = engine
        self.tasks = tasks

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine serves."""
        return self.engine.policy_version

    def start(self) -> None:
        """Nothing runs ahead on-policy."""

    def collect(self, step: int, version: int, keep: GroupFilter | None = None, max_batches: int = 1) -> StepRollout:
        """Fresh generation batches of the step's tasks."""
        def next_batch(attempt: int) -> tuple[Groups, CollectResult, int]:
            result = self.collector.collect(self.tasks.step(step, attempt))
            result.discard("aborted", engine_discarded(self.engine))
            return groups_of(result.trajectories), result, 0
        return fill_step(next_batch, self.tasks.n_groups, keep, max_batches, on_played=self.tasks.observe,
                         version=version)

    def evaluate(self) -> CollectResult:
        """Play the evaluation tasks, then forget them."""
        result = self.collector.collect(self.tasks.evaluation())
        forget_evaluation(self.engine)
        return result

    def load_weights(self, weights: dict[str, Any]) -> int:
        """Copy the weights into the engine."""
        return self.engine.load_weights(weights)

    def pop_metrics(self) -> dict[str, float]:
        """The engine's counters."""
        return self.engine.pop_metrics()

    def checkpoint(self) -> dict[str, Any]:
        """The engine's state (no stream)."""
        self.engine.reset_prefix_cache()
        return {"engine": self.engine.state_dict(), "stream": None}

    def restore(self, state: dict[str, Any]) -> None:
        """Restore the engine's state."""
        self.engine.load_state_dict(state["engine"])

    def close(self) -> None:
        """Nothing runs in the background."""

    def shutdown(self) -> None:
        """Close the engine."""
        self.engine.close()


class StreamSource:
    """Groups are played ahead, in a background thread, within the staleness bound."""

    def __init__(self, collector: RolloutCollector, engine: InferenceEngine, tasks: TaskSource,
                 max_staleness: int, accept_stale: bool = True) -> None:
        self.collector = collector
        self.engine = engine
        self.tasks = tasks
        self.max_staleness = max_staleness
        self.accept_stale = accept_stale  # stale_samples=correct; drop: only current-policy groups train
        self.stream: RolloutStream | None = None  # running between start and close
        self._position: dict[str, Any] | None = None  # the task-source position of a resumed run

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine serves."""
        return self._on_engine(lambda: self.engine.policy_version)

    def start(self) -> None:
        """Start playing groups in the background, from the restored position if any."""
        self.stream = RolloutStream(self.collector, self.engine, self.tasks.group, self.tasks.n_groups,
                                    self.max_staleness, version=self.engine.policy_version,
                                    consumed=self._position, accept_stale=self.accept_stale)
        self.stream.start()

    def collect(self, step: int, version: int, keep: GroupFilter | None = None, max_batches: int = 1) -> StepRollout:
        """The first complete groups to finish, none older than the staleness bound allows."""
        assert self.stream is not None, "StreamSource.collect before start"
        stream = self.stream

        def next_batch(attempt: int) -> tuple[Groups, CollectResult, int]:
            ready, stale = stream.take(self.tasks.n_groups, version)
            result = CollectResult([])
            for group in ready:
                result.absorb(group.result)
            result.discard("stale", stream.pop_stale_ids())
            result.discard("aborted", self._on_engine(lambda: engine_discarded(self.engine)))
            return [g.trajectories for g in ready if not g.failed], result, stale
        return fill_step(next_batch, self.tasks.n_groups, keep, max_batches, on_dropped=stream.replace,
                         version=version)

    def evaluate(self) -> CollectResult:
        """Play the evaluation tasks where the engine lives, then forget them."""
        tasks = self.tasks.evaluation()
        if self.stream is None:
            result = self.collector.collect(tasks)
            forget_evaluation(self.engine)
            return result

        async def evaluate() -> CollectResult:  # alone on the engine, between two batches of groups
            played = await self.collector.acollect(tasks)
            forget_evaluation(self.engine)
            return played
        return self.stream.between_batches(evaluate)

    def load_weights(self, weights: dict[str, Any]) -> int:
        """Hand the weights to the engine's thread; they apply at the end of the batch in flight."""
        if self.stream is None:
            return self.engine.load_weights(weights)
        return self.stream.load_weights(weights)

    def pop_metrics(self) -> dict[str, float]:
        """The engine's counters, read in its thread."""
        return self._on_engine(self.engine.pop_metrics)

    def checkpoint(self) -> dict[str, Any]:
        """The engine's state and the stream's task-source position."""
        if self.stream is None:
            self.engine.reset_prefix_cache()
            return {"engine": self.engine.state_dict(), "stream": self._position}

        async def forget() -> None:
            self.engine.reset_prefix_cache()
        # The prefixes are dropped between two batches (now, the batch in flight would keep them,
        # or not, by how far it got); the state read now holds no prefix either way.
        self.stream.post(forget)
        return {"engine": self.stream.call(self.engine.state_dict), "stream": self.stream.state()}

    def restore(self, state: dict[str, Any]) -> None:
        """Restore the engine's state; the stream will skip the groups already consumed."""
        self.engine.load_state_dict(state["engine"])
        self._position = state.get("stream")

    def close(self) -> None:
        """Cancel what is in flight and stop the thread; the engine is the caller's again."""
        if self.stream is not None:
            self._position = self.stream.state()
            self.stream.close()
            self.stream = None

    def shutdown(self) -> None:
        """Stop the thread, then close the engine."""
        self.close()
        self.engine.close()

    def _on_engine(self, fn: Callable[[], Any]) -> Any:
        return fn() if self.stream is None else self.stream.call(fn)


def forget_evaluation(engine: InferenceEngine) -> None:
    """Drop the prefixes and counters an evaluation left in an idle engine."""
    if engine.reset_prefix_cache():
        engine.pop_metrics()


def rollout_source(collector: RolloutCollector, engine: InferenceEngine, tasks: TaskSource,
                   max_staleness: int, accept_stale: bool = True) -> RolloutSource:
    """On-policy for max_staleness 0, a stream of groups played ahead otherwise."""
    if max_staleness == 0:
        return OnPolicySource(collector, engine, tasks)
    return StreamSource(collector, engine, tasks, max_staleness, accept_stale)
