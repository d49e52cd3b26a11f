"""Group filters: which of a step's groups are worth training on. Pure functions.

- `informative_groups` is DAPO's dynamic sampling (`algorithm.filter_groups`): a group whose
  episodes all scored the same gives every one of them a zero group-relative advantage, so it
  only dilutes the batch; it is dropped (and, with `max_num_gen_batches` > 1, replaced by
  groups of a further generation batch).
- `top_variance_groups` is RAGEN's variance filter (`rollout.rollout_filter_ratio`): keep the
  fraction of groups whose rewards vary most, the ones with the most to teach.
- `split_greedy_baselines` takes ReMax's greedy episode out of each group (it is not trained)
  and hands its reward to the group's sampled episodes as their baseline.
- `without_truncated` is `rollout.on_truncation=drop`: truncated episodes leave their group.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

from agentrl.trajectory import Trajectory

Groups = list[list[Trajectory]]


def groups_of(trajs: list[Trajectory]) -> Groups:
    """Trajectories grouped by group id, in order of first appearance."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    return list(groups.values())


def split_greedy_baselines(groups: Groups) -> Groups:
    """ReMax: each group's greedy episode (`baseline`) leaves the group, and its reward becomes
    the `reward_baseline` of the group's sampled episodes (verl's reward_baselines)."""
    out = []
    for g in groups:
        greedy = [t for t in g if t.baseline]
        sampled = [t for t in g if not t.baseline]
        for t in sampled:
            t.reward_baseline = greedy[0].total_reward if greedy else None
        out.append(sampled)
    return out


def group_metric(t: Trajectory, metric: Literal["success", "reward"]) -> float:
    """What DAPO compares within a group: success, or the return (rounded, so that float noise
    does not make equal returns look different)."""
    return float(t.success) if metric == "success" else round(t.total_reward, 6)


def informative_groups(groups: Groups, metric: Literal["success", "reward"]) -> Groups:
    """The groups whose episodes do not all share one value of `metric`."""
    return [g for g in groups if len({group_metric(t, metric) for t in g}) > 1]


def without_truncated(groups: Groups) -> tuple[Groups, int]:
    """Every sequence of a truncated episode leaves its group (the group's advantages are then
    computed over its other episodes); a group left empty is dropped. Also returns how many
    episodes left."""
    kept = [[t for t in g if t.truncation_reason is None] for g in groups]
    dropped = sum(t.segment == 0 and t.truncation_reason is not None for g in groups for t in g)
    return [g for g in kept if g], dropped


def top_variance_groups(groups: Groups, ratio: float) -> Groups:
    """The ceil(ratio * len(groups)) groups (at least one) with the largest standard deviation
    of returns, in their original order; ties keep the earlier group. ratio >= 1 keeps all."""
    if ratio >= 1.0 or not groups:
        return list(groups)
    k = max(1, math.ceil(ratio * len(groups)))
    stds = [statistics.stdev(t.total_reward for t in g) if len(g) > 1 else 0.0 for g in groups]
    chosen = sorted(range(len(groups)), key=lambda i: -stds[i])[:k]
    return [groups[i] for i in sorted(chosen)]
