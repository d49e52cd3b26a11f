"""Text environments (contract in base.py); the runtime imports the built-in ones to register them.

The seeds' env names are here too (from service.py): `EnvironmentService`, `math_verify_call`.
"""

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("EnvironmentService", "math_verify_call"):
        return getattr(importlib.import_module("agentrl.envs.service"), name)
    raise AttributeError(f"module 'agentrl.envs' has no attribute {name!r}")
