"""What an agent's `run_episode` returns, checked where it enters the collector.

An agent is user code: what it returns must be trajectories the trainer can pack and learn
from, or the run would die far from the cause (an id outside the vocabulary is an index error
in the embedding; a NaN logprob a NaN loss; a version older than the staleness bound an
assertion; an empty list trains on nothing and exits 0). `episode_problem` names the first thing
wrong, so that the episode fails as an agent error with that line and the run goes on.
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.contract import is_finite_number, short
from agentrl.trajectory import Task, Trajectory


def episode_problem(out: Any, task: Task, vocab_size: int | None = None,
                    versions: tuple[int, int] | None = None) -> str | None:
    """What is wrong with an agent's result for `task`, or None: it must be a Trajectory, or a
    non-empty list of them (one per segment), each well formed (`trajectory_problem`)."""
    if isinstance(out, Trajectory):
        return trajectory_problem(out, task, vocab_size, versions)
    if not isinstance(out, list):
        return f"returned {type(out).__name__} {short(out)}; expected a Trajectory or a list of them"
    if not out:
        return "returned an empty list; expected a Trajectory or a non-empty list of them (one per segment)"
    for i, traj in enumerate(out):
        if not isinstance(traj, Trajectory):
            return f"returned a list holding {type(traj).__name__} {short(traj)} at index {i}; expected Trajectory"
        problem = trajectory_problem(traj, task, vocab_size, versions)
        if problem is not None:
            return f"{problem} (segment {i})" if len(out) > 1 else problem
    return None


def trajectory_problem(t: Trajectory, task: Task, vocab_size: int | None = None,
                       versions: tuple[int, int] | None = None) -> str | None:
    """The first problem of one trajectory: token ids ints within the vocabulary (0..vocab_size-1),
    aligned fields, a 0/1 loss mask, finite logprobs and versions within `versions` (the engine's
    policy versions while the episode ran) on generated ids, finite rewards at positions inside
    the sequence, typed outcome fields, and the task's group and env seed."""
    for name in ("token_ids", "loss_mask", "logprobs", "versions", "rewards", "reward_positions", "turn_states"):
        value = getattr(t, name)
        if not isinstance(value, list):
            return f"returned a trajectory whose {name} is {type(value).__name__}; expected a list"
    n = len(t.token_ids)
    for name in ("loss_mask", "logprobs", "versions"):
        if len(getattr(t, name)) != n:
            return f"returned a trajectory with {len(getattr(t, name))} {name} for {n} token ids"
    bad = next((x for x in t.token_ids if not _is_int(x)), None)
    if bad is not None:
        return f"returned token id {short(bad)} ({type(bad).__name__}); expected ints"
    upper = vocab_size if vocab_size else None
    if t.token_ids and (min(t.token_ids) < 0 or (upper is not None and max(t.token_ids) >= upper)):
        bad = next(x for x in t.token_ids if x < 0 or (upper is not None and x >= upper))
        where = f"0..{upper - 1}" if upper is not None else "ids >= 0"
        return f"returned token id {bad} at position {t.token_ids.index(bad)}, outside the model's vocabulary ({where})"
    if any(m not in (0, 1) for m in t.loss_mask):
        bad = next(m for m in t.loss_mask if m not in (0, 1))
        return f"returned loss_mask value {short(bad)}; expected 0 or 1 per id"
    for i, (m, lp, v) in enumerate(zip(t.loss_mask, t.logprobs, t.versions)):
        if not _is_float32(lp):  # 0 where not generated: a NaN there still poisons a masked sum
            return f"returned logprob {short(lp)} for {'generated ' if m else ''}id {i}; expected a finite number"
        if not _is_int(v) or not -1 <= v < 2**62:
            return f"returned policy version {short(v)} for id {i}; expected an int (-1 where not generated)"
        if not m:
            continue
        if v < 0:
            return f"returned policy version {v} for generated id {i}; expected the engine's version (an int >= 0)"
        if versions is not None and not versions[0] <= v <= versions[1]:
            span = f"{versions[0]}" if versions[0] == versions[1] else f"{versions[0]}..{versions[1]}"
            return (f"returned policy version {v} for generated id {i}, but the engine served version {span} "
                    "while the episode ran (stale or made-up versions)")
    if len(t.rewards) != len(t.reward_positions):
        return f"returned {len(t.rewards)} rewards for {len(t.reward_positions)} reward positions"
    for r, pos in zip(t.rewards, t.reward_positions):
        if not _is_float32(r):
            return f"returned reward {short(r)}; expected a finite number"
        if not _is_int(pos) or not -1 <= pos < n:
            return f"returned reward position {short(pos)}; expected an index into its {n} token ids (or -1)"
    if not all(isinstance(s, str) for s in t.turn_states):
        odd = next(s for s in t.turn_states if not isinstance(s, str))
        return f"returned turn_states holding {type(odd).__name__}; expected str"
    for name in ("success", "terminated"):
        if not isinstance(getattr(t, name), bool):
            return f"returned {name}={short(getattr(t, name))}; expected a bool"
    for name in ("invalid_actions", "truncated_replies", "segment"):
        if not _is_int(getattr(t, name)) or getattr(t, name) < 0:
            return f"returned {name}={short(getattr(t, name))}; expected an int >= 0"
    if not isinstance(t.info, dict):
        return f"returned info of type {type(t.info).__name__}; expected dict"
    if not isinstance(t.role, str):
        return f"returned role={short(t.role)}; expected the role's name (a str; \"\" outside a game)"
    if t.truncation_reason is not None and not isinstance(t.truncation_reason, str):
        return f"returned truncation_reason={short(t.truncation_reason)}; expected a string or None"
    if t.group_id != task.group_id or t.env_seed != task.env_seed:
        return (f"returned a trajectory of group {short(t.group_id)}, env seed {short(t.env_seed)} for the task of "
                f"group {task.group_id}, env seed {task.env_seed} (build it with "
                "Trajectory.from_record(record, task, ...))")
    if t.reward_baseline is not None and not _is_float32(t.reward_baseline):
        return f"returned reward_baseline={short(t.reward_baseline)}; expected a finite number or None"
    return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_float32(x: Any) -> bool:
    """A finite number that stays finite as float32 (what the batch holds)."""
    return is_finite_number(x) and abs(float(x)) < 3.0e38
