"""The experiment's config: one schema of typed dataclasses, loaded from YAML and `key=value`
overrides, checked before any work starts.

    schema.py    Config, the whole experiment, and its env, agent, rollout and trainer sections
    algo.py · model.py · engine.py · serve.py · runtime.py
                 the other sections: algorithm/actor/critic, model, engine, serve, runtime
    checks.py    the checks across fields (combinations), run after every field has its range
    limits.py    every number's accepted range
    paths.py     every path: checked in one line, `~` expanded
    loading.py   defaults, YAML, overrides, type checks, did-you-mean; saving; the fields' docs
    yaml_reader.py  YAML in, with one-line errors (duplicate keys, alias bombs)

The names below are the config's public API (`from agentrl.config import Config, load_config`).
"""

from agentrl.config.algo import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    FilterGroupsConfig,
    KLControlConfig,
    PolicyLossConfig,
)
from agentrl.config.checks import BUILTIN_POLICY_LOSSES, validate
from agentrl.config.engine import EngineConfig, VllmConfig
from agentrl.config.loading import all_keys, field_docs, load_config, resolve, save_config, to_dict
from agentrl.config.model import LoraConfig, ModelConfig, TinyModelConfig, WarmStartConfig
from agentrl.config.runtime import RoleConfig, RuntimeConfig
from agentrl.config.schema import (
    AgentConfig,
    Config,
    CurriculumConfig,
    CustomEnvConfig,
    EnvConfig,
    EnvManagerConfig,
    RolloutConfig,
    TrainerConfig,
)
from agentrl.config.serve import ServeConfig
from agentrl.health import HealthConfig  # the health section's class lives beside the alarms it tunes

__all__ = ["ActorConfig", "AgentConfig", "AlgorithmConfig", "BUILTIN_POLICY_LOSSES", "Config", "CriticConfig",
           "CurriculumConfig", "CustomEnvConfig", "EngineConfig", "EnvConfig", "EnvManagerConfig", "FilterGroupsConfig",
           "HealthConfig", "KLControlConfig", "LoraConfig", "ModelConfig", "PolicyLossConfig", "RoleConfig",
           "RolloutConfig", "RuntimeConfig", "ServeConfig", "TinyModelConfig", "TrainerConfig", "VllmConfig",
           "WarmStartConfig", "all_keys", "field_docs", "load_config", "resolve", "save_config", "to_dict", "validate"]
