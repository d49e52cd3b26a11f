"""The types an env's `reset` and `step` return, checked wherever env outputs enter.

One definition, used by `check_env` (envs/checker.py, strict: it also asks for `success` at the
end and never both flags) and by the collector around every env of a run (rollout/collector.py),
so that a reward "1.0", an `info["success"]` of "no", a NaN reward or a dict observation is an
env error naming the field, never silently coerced (`float("1.0")`, `bool("no")`) nor a crash
far from the env (`unhashable type: 'dict'` when the batch is packed).

Each function returns None when the result is well formed, else `(check, detail)`: the check's
name (`reset result`, `step result`, `episode end`) and what is wrong with which field.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np


def short(value: Any, limit: int = 60) -> str:
    """repr(value) cut to `limit` characters, for messages about huge values."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value) if isinstance(value, str) else '?'} chars)"


def is_finite_number(x: Any) -> bool:
    """A finite real number (int, float, numpy scalar) that is not a bool."""
    if not isinstance(x, Real) or isinstance(x, (bool, np.bool_)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float (10**400)
        return False


def is_flag(x: Any) -> bool:
    """A bool (numpy's included: `pos == goal` on arrays gives one)."""
    return isinstance(x, (bool, np.bool_))


def reset_problem(result: Any, *, per_answer: bool = False) -> tuple[str, str] | None:
    """What is wrong with a `reset` result `(observation: str, info: dict)`, or None.
    `per_answer` (seed-style envs) also accepts a None observation: the question then comes from
    the dataset (seed 001's `MathCodeSingleStepEnv.reset` returns `(None, {})`)."""
    if not (isinstance(result, tuple) and len(result) == 2):
        return "reset result", f"returned {short(result)}; expected (observation, info)"
    obs, info = result
    if not isinstance(obs, str) and not (per_answer and obs is None):
        return "reset result", f"observation is {type(obs).__name__} ({short(obs)}); expected str"
    if not isinstance(info, dict):
        return "reset result", f"info is {type(info).__name__}; expected dict"
    opt = info.get("optimal_success")
    if opt is not None and not (is_finite_number(opt) and 0.0 <= opt <= 1.0):
        return "reset result", f"info['optimal_success']={opt!r}; expected a number in [0, 1]"
    return None


def step_problem(result: Any, *, strict: bool = True, per_answer: bool = False) -> tuple[str, str] | None:
    """What is wrong with a `step` result `(observation, reward, terminated, truncated, info)`.

    `strict` (check_env) also asks for a bool `success` on the step that ends the episode and
    rejects terminated and truncated both true; a run only rejects wrong types. `per_answer`
    (seed-style envs) accepts a list of rewards, one per answer, and any observation.
    """
    if not (isinstance(result, tuple) and len(result) == 5):
        return "step result", f"returned {short(result)}; expected (observation, reward, terminated, truncated, info)"
    obs, reward, terminated, truncated, info = result
    if not per_answer and not isinstance(obs, str):
        return "step result", f"observation is {type(obs).__name__} ({short(obs)}); expected str"
    rewards = reward if per_answer and isinstance(reward, (list, tuple)) and reward else [reward]
    if not all(is_finite_number(r) for r in rewards):
        what = "a finite number or a list of them" if per_answer else "a finite number"
        return "step result", f"reward={short(reward)}; expected {what}"
    for flag, value in (("terminated", terminated), ("truncated", truncated)):
        if not is_flag(value):
            return "step result", f"{flag}={short(value)}; expected a bool"
    if strict and terminated and truncated:
        return "episode end", "returned terminated and truncated both True; a step is one or the other"
    if not isinstance(info, dict):
        return "step result", f"info is {type(info).__name__}; expected dict"
    success = info.get("success")
    if strict and (terminated or truncated) and not is_flag(success):
        return "episode end", f"ended the episode but info['success']={short(success)}; expected a bool"
    if "success" in info and not is_flag(success):
        return "step result", f"info['success']={short(success)}; expected a bool"
    role = info.get("role")
    if role is not None and not isinstance(role, str):
        return "step result", f"info['role']={short(role)}; expected the name of the role that acts next (a str)"
    per_role = info.get("rewards")
    if per_role is not None and not (isinstance(per_role, dict) and all(
            isinstance(k, str) and is_finite_number(v) for k, v in per_role.items())):
        return "step result", f"info['rewards']={short(per_role)}; expected role names -> finite numbers"
    metrics = info.get("metrics")
    if metrics is not None:
        bad = ({k: v for k, v in metrics.items() if not (isinstance(k, str) and is_finite_number(v))}
               if isinstance(metrics, dict) else metrics)
        if bad or not isinstance(metrics, dict):
            return "step result", f"info['metrics'] has {short(bad)}; expected names -> finite numbers"
    return None
