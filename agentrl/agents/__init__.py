"""Agents own the conversation (contract in base.py); the runtime imports the built-in ones; chat,
math_retry and tool play one episode loop (loop.py) with hooks of their own.

The seeds' (AReaL legacy) names are here too, imported lazily (seed_api.py, compat.py): `Agent` (the
queue-style base with `collect_trajectory`; our own contract is `agents.base.Agent`),
`SequenceSample`, `BundledGenerationOutputs`, `GenerationHyperparameters`, `SeedAgentAdapter`.
"""

import importlib
from typing import Any

_SEED_NAMES = ("Agent", "SequenceSample", "BundledGenerationOutputs", "GenerationHyperparameters")


def __getattr__(name: str) -> Any:
    if name in _SEED_NAMES:
        return getattr(importlib.import_module("agentrl.agents.seed_api"), name)
    if name == "SeedAgentAdapter":
        return importlib.import_module("agentrl.agents.compat").SeedAgentAdapter
    raise AttributeError(f"module 'agentrl.agents' has no attribute {name!r}")
