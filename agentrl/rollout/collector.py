"""Runs a step's episodes concurrently and returns their trajectories, group by group.

This is the seam between multi-turn rollout and training: everything after `collect` sees
only token sequences with a loss mask. Episodes run as asyncio tasks, each with its own env
instance; their engine requests meet in the engine's batches. Each task names its env
definition (its tag): the collector builds that tag's env and plays it with that tag's agent,
so one batch can mix FrozenLake, Sokoban and math. An episode that raises is recorded and its
whole group is dropped: a partial group would bias the group baseline.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentrl.rollout.trajectory import Task, Trajectory

if TYPE_CHECKING:  # types only: importing the collector must not import envs or agents
    from agentrl.agents.base import Agent
    from agentrl.envs.base import Env
    from agentrl.llm.engine import LLMClient


@dataclass
class TagSpec:
    """How episodes of one tag are played: a fresh env per episode, and the agent."""

    env_factory: Callable[[], "Env"]
    agent: "Agent"


@dataclass
class CollectResult:
    """Trajectories of the groups that completed, and what went wrong with the others."""

    trajectories: list[Trajectory]
    errors: list[str] = field(default_factory=list)
    dropped_groups: int = 0


class RolloutCollector:
    """Plays many episodes at once, each with its tag's env and agent, through one engine."""

    def __init__(self, tags: Mapping[str, TagSpec], llm: "LLMClient") -> None:
        if not tags:
            raise ValueError("RolloutCollector needs at least one tag")
        self.tags = dict(tags)
        self.llm = llm

    @classmethod
    def single(cls, env_factory: Callable[[], "Env"], agent: "Agent", llm: "LLMClient",
               tag: str = "") -> RolloutCollector:
        """A collector of one env and one agent (tasks carry `tag`, "" by default)."""
        return cls({tag: TagSpec(env_factory, agent)}, llm)

    def collect(self, tasks: list[Task]) -> CollectResult:
        """Run every task to the end (blocking); keep only groups whose episodes all finished."""
        return asyncio.run(self.acollect(tasks))

    async def acollect(self, tasks: list[Task]) -> CollectResult:
        """Async form of `collect`."""
        unknown = sorted({t.tag for t in tasks} - set(self.tags))
        if unknown:  # a wiring bug, not an episode failure: fail loudly
            raise ValueError(f"tasks name tags {unknown} this collector has no env for; known: {sorted(self.tags)}")
        outcomes = await asyncio.gather(*(self._episode(t) for t in tasks))
        failed_groups = {t.group_id for t, o in zip(tasks, outcomes) if isinstance(o, str)}
        errors = [o for o in outcomes if isinstance(o, str)]
        kept = [o for t, o in zip(tasks, outcomes)
                if not isinstance(o, str) and t.group_id not in failed_groups]
        return CollectResult(kept, errors, len(failed_groups))

    async def _episode(self, task: Task) -> Trajectory | str:
        spec = self.tags[task.tag]
        env = None
        try:
            env = spec.env_factory()
            traj = await spec.agent.run_episode(task, env, self.llm)
            traj.info["tag"] = task.tag
            return traj
        except Exception as e:  # a crashed episode is recorded and skipped, never fatal
            last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
            where = f" at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}" if last else ""
            return f"[{task.tag}] {type(e).__name__}: {e}{where}" if task.tag else f"{type(e).__name__}: {e}{where}"
        finally:
            if env is not None:
                env.close()


def make_tasks(seed: int, step: int, n_groups: int, group_size: int, *, greedy: bool = False,
               seed_base: int = 0, tags: Sequence[str] | None = None) -> list[Task]:
    """Tasks for one step: `n_groups` env seeds, each repeated `group_size` times.

    `tags` gives each group's env definition (one entry per group); None tags them all "".
    A group's seeds depend only on (seed, step, group index), not on its tag.
    """
    if tags is not None and len(tags) != n_groups:
        raise ValueError(f"make_tasks: {len(tags)} tags for {n_groups} groups")
    tasks = []
    for g in range(n_groups):
        env_seed = seed_base + _mix(seed, step, g) % 1_000_000
        tag = tags[g] if tags is not None else ""
        for k in range(group_size):
            tasks.append(Task(env_seed=env_seed, group_id=g,
                              sampling_seed=_mix(seed, step, g * 4099 + k + 1), greedy=greedy, tag=tag))
    return tasks


def _mix(*xs: int) -> int:
    """A deterministic 63-bit hash of integers (Python's hash() of ints is not mixed enough)."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h ^= (x + 0x9E3779B97F4A7C15 + ((h << 6) & (2**64 - 1)) + (h >> 2)) & (2**64 - 1)
        h = (h * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    return h >> 1
