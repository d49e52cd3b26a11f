"""Checking an env's constructor arguments, with errors that name the argument and what is allowed."""

from __future__ import annotations

import math
from typing import Any

from agentrl.errors import ConfigError


def is_int(x: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_arg(env: str, ok: bool, name: str, value: Any, allowed: str) -> None:
    """Raise a ConfigError naming the env's argument, its value and what is allowed."""
    if not ok:
        raise ConfigError(f"{env}: {name}={value!r} is invalid; {name} must be {allowed}")


def import_extra(module: str, extra: str, who: str) -> Any:
    """Import an optional suite's `module`, or raise a ConfigError saying which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{who} needs the '{module}' package ({type(e).__name__}: {e}); "
                          f"install the extra: pip install 'agentrl[{extra}]'") from None
