"""Which episodes each part of a run plays: the one home of every env seed and group.

A group is `group_size` episodes of one env seed (compared with each other by group
baselines); a training step plays `n_groups` groups. Env seeds are a deterministic hash of
(run seed, step, group index), so any run with the same seed plays the same tasks, whatever
its rollout mode, and a resumed run plays what the straight run would have. The bases keep
the kinds of tasks apart: training seeds lie below EVAL_SEED_BASE, evaluation seeds above it,
warm-start demonstrations above DEMO_SEED_BASE. With a curriculum (rollout/curriculum.py) a
training group's env seed is drawn from its pool by the estimates instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from agentrl.trajectory import Task, Trajectory

EVAL_SEED_BASE = 1_000_000  # eval env seeds live above every training seed
DEMO_SEED_BASE = 2_000_000  # warm-start demonstrations, apart from both
GEN_BATCH_STRIDE = 1_000_003  # extra generation batches of a step draw seeds far from other steps
EVAL_STEP = 2**31 - 1  # a fixed pseudo-step: every evaluation plays the same held-out tasks


class TaskDrawer(Protocol):
    """What draws training env seeds from estimates of the tasks (rollout/curriculum.py's Curriculum)."""

    def draw(self, step: int, attempt: int, group_tags: Sequence[str]) -> list[int]:
        """The env seed of each group of generation batch `attempt` of step `step`."""
        ...

    def observe(self, groups: list[list[Trajectory]]) -> None:
        """Update the estimates from played groups."""
        ...

    def pop_stats(self) -> dict[str, float]:
        """curriculum/* since the last call."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`'s state."""
        ...


@dataclass(frozen=True)
class TaskSource:
    """The tasks of a run's steps, stream groups, evaluations and demonstrations."""

    seed: int  # the run's seed
    group_size: int  # episodes per group (one env seed)
    train_tags: tuple[str, ...]  # the env definition of each group of a step: one entry per group
    val_tags: tuple[str, ...] = ("",)  # the env definition of each evaluation episode
    greedy_baselines: bool = False  # ReMax: each training group also plays one greedy episode, its baseline
    curriculum: TaskDrawer | None = field(default=None, compare=False)  # draws training env seeds; None: fresh ones

    @property
    def n_groups(self) -> int:
        """Groups per training step."""
        return len(self.train_tags)

    def step(self, step: int, attempt: int = 0) -> list[Task]:
        """The groups of training step `step` (from 1); attempt > 0: a further generation batch
        of that step (DAPO's dynamic sampling), with fresh env seeds and group ids of its own."""
        seeds = self.curriculum.draw(step, attempt, self.train_tags) if self.curriculum is not None else None
        tasks = make_tasks(self.seed, step + attempt * GEN_BATCH_STRIDE, self.n_groups, self.group_size,
                           tags=self.train_tags, env_seeds=seeds)
        if self.greedy_baselines:  # after each group's sampled episodes: its greedy one (same env seed)
            per_group = [tasks[g * self.group_size:(g + 1) * self.group_size] for g in range(self.n_groups)]
            tasks = [t for group in per_group
                     for t in [*group, replace(group[0], greedy=True, baseline=True,
                                               sampling_seed=mix(group[0].sampling_seed, 0))]]
        # Group ids stay distinct across generation batches: baselines are per group.
        return [replace(t, group_id=t.group_id + attempt * self.n_groups) for t in tasks]

    def observe(self, groups: list[list[Trajectory]]) -> None:
        """Played training groups update the curriculum's estimates (without one: nothing to do)."""
        if self.curriculum is not None:
            self.curriculum.observe(groups)

    def group(self, index: int) -> list[Task]:
        """Group `index` of the stream (asynchronous rollout): the same env seeds as on-policy
        step index // n_groups + 1 plays, so both modes train on one sequence of tasks."""
        step, g = divmod(index, self.n_groups)
        return [replace(t, group_id=index) for t in self.step(step + 1) if t.group_id == g]

    def evaluation(self) -> list[Task]:
        """The held-out evaluation episodes: one greedy episode per entry of `val_tags`, the same
        ones at every evaluation (a game's against the random legal player)."""
        # A game's evaluation plays the policy in one seat against the env's random legal player
        # (agents/game.py); an env without roles ignores the opponent.
        return [replace(t, opponent="random") for t in make_tasks(
            self.seed, EVAL_STEP, len(self.val_tags), 1, greedy=True, seed_base=EVAL_SEED_BASE, tags=self.val_tags)]

    def demonstrations(self, step: int, tags: Sequence[str]) -> list[Task]:
        """One warm-start batch: an episode per entry of `tags`, each with its own env seed."""
        return make_tasks(self.seed, step, len(tags), 1, seed_base=DEMO_SEED_BASE, tags=tags)


def make_tasks(seed: int, step: int, n_groups: int, group_size: int, *, greedy: bool = False,
               seed_base: int = 0, tags: Sequence[str] | None = None,
               env_seeds: Sequence[int] | None = None) -> list[Task]:
    """Tasks for one step: `n_groups` env seeds, each repeated `group_size` times.

    `tags` gives each group's env definition (one entry per group); None tags them all "".
    A group's seeds depend only on (seed, step, group index), not on its tag; `env_seeds` (one
    per group, a curriculum's draw) replaces the env seeds, not the sampling seeds.
    """
    if tags is not None and len(tags) != n_groups:
        raise ValueError(f"make_tasks: {len(tags)} tags for {n_groups} groups")
    tasks = []
    for g in range(n_groups):
        env_seed = seed_base + (env_seeds[g] if env_seeds is not None else mix(seed, step, g) % 1_000_000)
        tag = tags[g] if tags is not None else ""
        for k in range(group_size):
            tasks.append(Task(env_seed=env_seed, group_id=g,
                              sampling_seed=mix(seed, step, g * 4099 + k + 1), greedy=greedy, tag=tag))
    return tasks


def retry_seed(sampling_seed: int, attempt: int) -> int:
    """The sampling seed of retry `attempt` of an episode (a fresh sample, reproducibly)."""
    return mix(sampling_seed, attempt)


def mix(*xs: int) -> int:
    """A deterministic 63-bit hash of integers (Python's hash() of ints is not mixed enough)."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h ^= (x + 0x9E3779B97F4A7C15 + ((h << 6) & (2**64 - 1)) + (h >> 2)) & (2**64 - 1)
        h = (h * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    return h >> 1
