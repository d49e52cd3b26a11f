"""Checking an env's constructor arguments, with errors that name the argument and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.errors import ConfigError, shown

T = TypeVar("T")

# Rewards beyond this are typos: a few summed in float32 losses would overflow to inf.
REWARD_MAX = 1e6
# Most moves an env's horizon or generator may take: its optimum and rooms are computed in loops
# this long before any work (an episode's turns are bounded by max_turns anyway).
STEPS_MAX = 1000


def is_int(x: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_reward(x: Any) -> bool:
    """A finite number within +-REWARD_MAX."""
    return is_number(x) and abs(x) <= REWARD_MAX


def is_count(x: Any, lo: int, hi: int) -> bool:
    """An int (not a bool) in [lo, hi]."""
    return is_int(x) and lo <= x <= hi


def check_arg(env: str, ok: bool, name: str, value: Any, allowed: str) -> None:
    """Raise a ConfigError naming the env's argument, its value and what is allowed."""
    if not ok:
        raise ConfigError(f"{env}: {name}={shown(value)} is invalid; {name} must be {allowed}")


def built(what: str, make: Callable[[], T]) -> T:
    """`make()`; whatever it raises becomes a one-line ConfigError: "`what` failed: Type: first line"."""
    try:
        return make()
    except Exception as e:
        first = next((line.strip() for line in str(e).splitlines() if any(c.isalnum() for c in line)), "")
        raise ConfigError(f"{what} failed: {type(e).__name__}: {first}") from None


def import_extra(module: str, extra: str, who: str) -> Any:
    """Import an optional suite's `module`, or raise a ConfigError saying which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{who} needs the '{module}' package ({type(e).__name__}: {e}); "
                          f"install the extra: pip install 'agentrl[{extra}]'") from None
