"""Curricula (`rollout.curriculum`): which task each training group plays, chosen by a running
estimate of every task's success, so that episodes go where the group signal is.

A group whose episodes all succeed (or all fail) gives each of them a zero group-relative
advantage: it teaches nothing. DAPO's dynamic sampling (`algorithm.filter_groups`) and RAGEN's
variance filter (`rollout.rollout_filter_ratio`) drop such groups after paying for them; a
curriculum spends fewer episodes on them in the first place.

- Tasks: each env tag has a pool of `pool_size` distinct training env seeds (task i of the pool,
  the same for every tag). Without a curriculum every group plays a fresh seed and no task comes
  back; with one, tasks come back, so an estimate of their success means something.
- Estimate: after a group of a task is played, its success rate r (over the group's episodes)
  updates the task's estimate p <- (1 - ema) p + ema r (the first group sets p = r). Every played
  group counts, also those the group filters drop afterwards (that is when a task shows itself
  solved).
- Draws: each group of a generation batch is, with probability `uniform_ratio`, a task drawn
  uniformly from the tag's whole pool, seen or not (the floor: no task is forgotten, unseen ones
  get their first look); otherwise a seen task drawn with probability proportional to its weight,
  0 at or beyond the thresholds (estimate <= hard_threshold or >= easy_threshold) and `rule`'s
  value between them. The built-in rule, `informative`, weighs a task by the chance that a group of
  n episodes is not unanimous under its estimate, 1 - p^n - (1 - p)^n: 0 for tasks always solved or
  always failed, largest at p = 1/2 (RAGEN-2's signal-to-noise argument: the group's reward variance
  is the signal). A draw with no seen task of positive weight falls back to uniform. Within a batch
  a task is drawn at most once while others are left.

Departures from prime-rl's difficulty pools: prime-rl marks a problem easy or hard from its last
batch's average reward and samples fixed fractions of each pool; here the estimate is an EMA and
the weight is continuous. Deterministic: a batch's draws depend only on (run seed, step, attempt)
and the estimates, so the state a checkpoint keeps is the estimates alone (`state_dict`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.config import CurriculumConfig
from agentrl.registry import CURRICULUM_RULES, register_curriculum_rule
from agentrl.rollout.filters import Groups
from agentrl.rollout.tasks import mix
from agentrl.trajectory import Trajectory

POOL_SALT = 0x6375_7272  # keeps the pool's seeds and the draws' randomness apart from other hashes
DRAW_SALT = 0x6472_6177
Rule = Callable[[float, int, int], float]  # (estimate, groups seen, group_size) -> weight in the draws


@register_curriculum_rule("informative")
def informative(estimate: float, seen: int, group_size: int) -> float:
    """The chance that a group of `group_size` episodes is neither all solved nor all failed."""
    return 1.0 - estimate ** group_size - (1.0 - estimate) ** group_size


class Curriculum:
    """Success estimates of the training tasks, and the draws they steer."""

    def __init__(self, seed: int, group_size: int, tags: Sequence[str], pool_size: int, ema: float = 0.5,
                 uniform_ratio: float = 0.25, hard_threshold: float = 0.0, easy_threshold: float = 1.0,
                 rule: Rule = informative) -> None:
        self.seed, self.group_size, self.ema, self.uniform_ratio = seed, group_size, ema, uniform_ratio
        self.hard_threshold, self.easy_threshold, self.rule = hard_threshold, easy_threshold, rule
        self.tags = tuple(dict.fromkeys(tags))
        self.seeds = pool_seeds(seed, pool_size)  # task i -> env seed, distinct
        self.index = {s: i for i, s in enumerate(self.seeds)}
        self.estimates: dict[str, dict[int, tuple[float, int]]] = {t: {} for t in self.tags}  # task -> (p, groups seen)
        self._drawn: list[tuple[bool, float | None]] = []  # since pop_stats: (from the weighted draw, estimate)

    @classmethod
    def from_config(cls, cfg: CurriculumConfig, seed: int, group_size: int, tags: Sequence[str]) -> Curriculum:
        """The curriculum `cfg` describes (its rule looked up by name), over the env tags `tags`."""
        return cls(seed, group_size, tags, cfg.pool_size, cfg.ema, cfg.uniform_ratio, cfg.hard_threshold,
                   cfg.easy_threshold, CURRICULUM_RULES.get(cfg.rule))

    @property
    def pool_size(self) -> int:
        """Tasks in each tag's pool."""
        return len(self.seeds)

    def draw(self, step: int, attempt: int, group_tags: Sequence[str]) -> list[int]:
        """The env seed of each group of generation batch `attempt` of step `step` (one per entry
        of `group_tags`, the group's env tag)."""
        rng = random.Random(mix(self.seed, DRAW_SALT, step, attempt))
        taken: dict[str, set[int]] = {t: set() for t in self.tags}
        out = []
        for tag in group_tags:
            seen = self.estimates[tag]
            weights = {i: self.weight(p, n) for i, (p, n) in seen.items() if i not in taken[tag]}
            weights = {i: w for i, w in sorted(weights.items()) if w > 0.0}
            uniform = rng.random() < self.uniform_ratio or not weights
            if uniform:
                free = self.pool_size - len(taken[tag])
                i = self._nth_free(rng.randrange(free), taken[tag]) if free else rng.randrange(self.pool_size)
            else:
                i = rng.choices(list(weights), weights=list(weights.values()))[0]
            taken[tag].add(i)
            self._drawn.append((not uniform, seen[i][0] if i in seen else None))
            out.append(self.seeds[i])
        return out

    def weight(self, estimate: float, seen: int) -> float:
        """A seen task's weight in the weighted draws: 0 at or beyond a threshold, the rule's between."""
        if estimate <= self.hard_threshold or estimate >= self.easy_threshold:
            return 0.0
        return max(0.0, float(self.rule(estimate, seen, self.group_size)))

    def observe(self, groups: Groups) -> None:
        """Update the estimates of the tasks these played groups (sampled episodes only) belong to."""
        for group in groups:
            first = group[0] if group else None
            i = self.index.get(first.env_seed) if first is not None else None
            if first is None or i is None or first.tag not in self.estimates:
                continue  # not a pool task
            rate = group_success(group)
            p, n = self.estimates[first.tag].get(i, (rate, 0))
            self.estimates[first.tag][i] = ((1.0 - self.ema) * p + self.ema * rate if n else rate, n + 1)

    def pop_stats(self) -> dict[str, float]:
        """curriculum/* of the draws since the last call, and of the estimates now."""
        drawn, self._drawn = self._drawn, []
        seen = [(p, n) for tag in self.tags for p, n in self.estimates[tag].values()]
        out = {"curriculum/pool_draws": sum(w for w, _ in drawn) / len(drawn) if drawn else 0.0,
               "curriculum/informative_tasks": float(sum(self.weight(p, n) > 0.0 for p, n in seen)),
               "curriculum/unseen_tasks": float(self.pool_size * len(self.tags) - len(seen)),
               "curriculum/easy_tasks": float(sum(p >= self.easy_threshold for p, _ in seen)),
               "curriculum/hard_tasks": float(sum(p <= self.hard_threshold for p, _ in seen))}
        known = [p for _, p in drawn if p is not None]
        if known:  # the drawn tasks seen before: what the curriculum expected of them
            out["curriculum/drawn_estimate"] = sum(known) / len(known)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The estimates (all a resumed run needs: draws are a function of them and the step)."""
        return {"pool_size": self.pool_size, "estimates": {t: dict(e) for t, e in self.estimates.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`'s estimates."""
        self.estimates = {t: dict(state["estimates"].get(t, {})) for t in self.tags}

    def _nth_free(self, k: int, taken: set[int]) -> int:
        """The k-th pool index (from 0) not in `taken`."""
        for i in sorted(taken):
            if i <= k:
                k += 1
        return k


def pool_seeds(seed: int, size: int) -> list[int]:
    """`size` distinct training env seeds (below 1_000_000, like every training seed)."""
    seeds: dict[int, None] = {}
    k = 0
    while len(seeds) < size:
        seeds.setdefault(mix(seed, POOL_SALT, k) % 1_000_000, None)
        k += 1
    return list(seeds)


def group_success(group: list[Trajectory]) -> float:
    """The success rate of a group's episodes."""
    eps = [t for t in group if t.segment == 0]
    return sum(float(t.success) for t in eps) / len(eps) if eps else 0.0
