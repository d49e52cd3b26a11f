"""agentrl: RL for multi-turn language-model agents.

The public API, imported lazily (so `import agentrl` stays fast):

- `load_config(source=None, overrides=())`: a validated Config from a YAML file, a dict or a
  Config, then `key=value` overrides;
- `fit(config, agent_cls=None, env_cls=None, tokenizer=None, ...)`: train, with classes passed
  directly (no registry, no `imports=`); returns the run's summary (named `fit`, as
  `AgentTrainer.fit`, because `agentrl.train` is the training package);
- `AgentTrainer(config=..., tokenizer=..., agent_cls=...)` with `init_workers()` and `fit()`
  (seed 003's verl-style entry point);
- the registries: `register_env` (alias `register_environment`), `register_agent`,
  `register_estimator`;
- the seeds' (AReaL legacy) names: `Agent` (the queue-style base: `collect_trajectory`; our own
  contract is `agentrl.agents.base.Agent`, `run_episode`), `EnvironmentService`,
  `SequenceSample`, `BundledGenerationOutputs`, `GenerationHyperparameters`, `math_verify_call`;
- `tool`, the decorator that makes a function a tool the model can call (docs/tools.md);
- `Config`, `check_env`, and the error types `AgentRLError`, `ConfigError`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_config": "agentrl.api", "fit": "agentrl.api", "AgentTrainer": "agentrl.api",
    "register_env": "agentrl.registry", "register_agent": "agentrl.registry",
    "register_environment": "agentrl.registry", "register_estimator": "agentrl.registry",
    "Agent": "agentrl.agents.seed_api", "SequenceSample": "agentrl.agents.seed_api",
    "BundledGenerationOutputs": "agentrl.agents.seed_api", "GenerationHyperparameters": "agentrl.agents.seed_api",
    "EnvironmentService": "agentrl.envs.service", "math_verify_call": "agentrl.envs.service",
    "Config": "agentrl.config", "check_env": "agentrl.envs.checker", "tool": "agentrl.tools",
    "AgentRLError": "agentrl.errors", "ConfigError": "agentrl.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
