"""Summaries of a set of trajectories: per env tag, and why episodes were cut short.

Training rollouts log under `env/<tag>/`, evaluation under `eval/<tag>/`: success, return,
turns, the fraction truncated, and the mean of every numeric `info["metrics"]` entry the
episodes reported (e.g. math_retry's `success_at_k`). Across tags, `rollout/truncated_<reason>`
is the fraction of episodes that ended for each truncation reason.

Provenance of the trained ids (`provenance_metrics`): every generated id carries the policy
version that sampled it; a version below 0 is missing (unknown), never age 0: it is left out of
the staleness and counted against `rollout/version_coverage`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from agentrl.trajectory import Trajectory

# Why an episode ended without the env terminating it: the env's own limit, the agent's turn
# limit, the context limit, or the per-episode token budget (agents record it in the trajectory).
TRUNCATION_REASONS = ("env", "max_turns", "context", "token_budget")


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _numeric(value: object) -> bool:
    # bool is an int: a flag averages to a rate; a NaN or inf would poison the mean
    return isinstance(value, (int, float)) and math.isfinite(value)


def episodes(trajs: Iterable[Trajectory]) -> list[Trajectory]:
    """One trajectory per episode (its segment 0, whose return, outcome and reset info are the
    episode's), for stats that count episodes, not sequences."""
    return [t for t in trajs if t.segment == 0]


def per_episode(trajs: list[Trajectory], value: Callable[[Trajectory], float]) -> float:
    """`value` summed over every sequence of `trajs`, per episode (turns, invalid replies, ...)."""
    n = len(episodes(trajs))
    return float(sum(value(t) for t in trajs) / n) if n else 0.0


def episode_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """Means over the episodes of `trajs`: success, return, turns, truncated, and each numeric
    info["metrics"] key."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    firsts = episodes(trajs)
    for t in firsts:
        metrics = t.info.get("metrics")
        for key, value in (metrics if isinstance(metrics, dict) else {}).items():
            if _numeric(value):
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] = counts.get(key, 0) + 1
    out = {key: sums[key] / counts[key] for key in sums}
    out.update({
        "success": _mean([float(t.success) for t in firsts]),
        "return": _mean([t.total_reward for t in firsts]),
        "turns": per_episode(trajs, lambda t: t.num_turns),
        "truncated": _mean([float(t.truncated) for t in firsts]),
        "episodes": float(len(firsts)),
    })
    optimal = [float(t.reset_info["optimal_success"]) for t in firsts if "optimal_success" in t.reset_info]
    if optimal:
        out["optimal_success"] = _mean(optimal)
    return out


def by_tag(trajs: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories grouped by their tag, in order of first appearance."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.tag, []).append(t)
    return groups


def tag_metrics(trajs: list[Trajectory], prefix: str) -> dict[str, float]:
    """`episode_stats` of each tag's trajectories, keyed `<prefix>/<tag>/<stat>`, and in a game of
    several roles of each role's, keyed `<prefix>/<tag>/role/<role>/<stat>` (`win`, `draw`, `loss`
    among them; each seat of a game counts as an episode)."""
    out = {}
    for tag, group in by_tag(trajs).items():
        out.update({f"{prefix}/{tag}/{key}": value for key, value in episode_stats(group).items()})
        for role in sorted({t.role for t in group if t.role}):
            out.update({f"{prefix}/{tag}/role/{role}/{key}": value
                        for key, value in episode_stats([t for t in group if t.role == role]).items()})
    return out


def truncation_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """`rollout/truncated_<reason>`: the fraction of episodes that ended for each reason."""
    reasons = [t.truncation_reason for t in episodes(trajs)]
    return {f"rollout/truncated_{r}": _mean([float(x == r) for x in reasons]) for r in TRUNCATION_REASONS}


def reply_versions(traj: Trajectory) -> list[set[int]]:
    """The known policy versions (>= 0) of each reply of `traj` (a run of generated ids)."""
    replies: list[set[int]] = []
    inside = False
    for version, generated in zip(traj.versions, traj.loss_mask):
        if generated and not inside:
            replies.append(set())
        inside = bool(generated)
        if generated and version >= 0:
            replies[-1].add(version)
    return replies


def partial_replies(traj: Trajectory) -> int:
    """Replies of `traj` whose ids were sampled under more than one (known) policy version: a
    weight update landed while they were generated (partial rollout, rollout.max_staleness >= 1)."""
    return sum(len(v) > 1 for v in reply_versions(traj))


def provenance_metrics(trajs: list[Trajectory], version: int | None) -> dict[str, float]:
    """Versions of the generated ids of `trajs`, trained at policy `version`:
    `rollout/version_coverage` (share whose version is known; 1.0 with no ids),
    `rollout/staleness_mean` and `_max` (token-weighted, known versions only, when `version` is
    given) and `rollout/replies_spanning_versions` (share of replies sampled under more than one)."""
    known = [v for t in trajs for v, m in zip(t.versions, t.loss_mask) if m and v >= 0]
    generated = sum(t.num_generated for t in trajs)
    replies = [r for t in trajs for r in reply_versions(t)]
    out = {"rollout/version_coverage": len(known) / generated if generated else 1.0,
           "rollout/replies_spanning_versions": _mean([float(len(r) > 1) for r in replies])}
    if version is not None and known:
        lags = [version - v for v in known]
        out.update({"rollout/staleness_mean": sum(lags) / len(lags), "rollout/staleness_max": float(max(lags))})
    return out
