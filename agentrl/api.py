"""The Python API: load a config, train with classes passed directly, and seed 003's AgentTrainer.

    from agentrl import load_config, fit, AgentTrainer

    cfg = load_config({"env": {"type": "frozen_lake"}}, ["trainer.total_steps=20"])
    summary = fit(cfg, agent_cls=MyAgent, env_cls=MyEnv)         # no registry, no imports=

    trainer = AgentTrainer(config=cfg, tokenizer=None, agent_cls=MyAgent, env_cls=MyEnv)
    trainer.init_workers()                                        # builds every part
    summary = trainer.fit()                                       # trains; the run's summary

A class passed as `agent_cls` / `env_cls` is registered under its class name (a suffix `-2`,
`-3`... when another object holds that name; a class registered before keeps its name) and
becomes `agent.type` / `env.type`. The run folder's config.yaml names that type: to resume the
run from the CLI, register the class in a module and pass it with `imports=`.
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl import config as config_module
from agentrl.config import Config, save_config
from agentrl.errors import ConfigError
from agentrl.registry import AGENTS, ENVS, Registry
from agentrl.tokenizer import Tokenizer

if TYPE_CHECKING:
    from agentrl.runtime.handle import RunHandle

ConfigSource = Config | Mapping[str, Any] | str | Path | None

# verl's RayPPOTrainer arguments seed 003 passes: accepted by AgentTrainer and not needed here.
VERL_ARGS = ("role_worker_mapping", "resource_pool_manager", "processor", "reward_fn", "val_reward_fn",
             "ray_worker_group_cls", "train_dataset", "val_dataset", "collate_fn", "train_sampler", "device_name")


def load_config(source: ConfigSource = None, overrides: Sequence[str] | Mapping[str, Any] = ()) -> Config:
    """A validated Config from defaults, a YAML file, a dict (or a Config), then `overrides`
    (`["trainer.total_steps=20"]` or `{"trainer.total_steps": 20}`)."""
    items = _override_items(overrides)
    if source is None or isinstance(source, (str, Path)):
        return config_module.load_config(source, items)
    if isinstance(source, Config):
        data: Any = None
    elif hasattr(source, "_content") and type(source).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf  # verl's configs are OmegaConf DictConfigs

        data = OmegaConf.to_container(source, resolve=True)
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        raise ConfigError(f"load_config: expected a YAML path, a dict or a Config, got {type(source).__name__}")
    # Through a file, so a dict meets exactly the reading and validation a YAML file meets.
    with tempfile.TemporaryDirectory(prefix="agentrl-config-") as tmp:
        path = Path(tmp) / "config.yaml"
        if isinstance(source, Config):
            save_config(source, path)
        else:
            import yaml

            try:
                path.write_text(yaml.safe_dump(data, sort_keys=False))
            except yaml.YAMLError as e:
                raise ConfigError(f"load_config: the dict holds a value that is not plain data ({e}); use str, "
                                  "numbers, bools, None, lists and dicts") from None
        return config_module.load_config(path, items)


def _override_items(overrides: Sequence[str] | Mapping[str, Any]) -> list[str]:
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of 'key=value' strings or a dict, got the string {overrides!r}")
    if isinstance(overrides, Mapping):
        return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]  # JSON values are YAML
    return list(overrides)


def register_class(registry: Registry, cls: Any, what: str) -> str:
    """The name `cls` is registered under in `registry`, registering it under its class name
    (with a -2, -3... suffix when that name holds another object) if it is not there yet."""
    if not callable(cls):
        raise ConfigError(f"{what}= must be a class (or factory), got {type(cls).__name__}")
    for name in registry.names():
        if registry.get(name) is cls:
            return name
    base = getattr(cls, "__name__", what)
    name, k = base, 2
    while name in registry:
        name, k = f"{base}-{k}", k + 1
    registry.register(name, cls)
    return name


def with_classes(cfg: Config, agent_cls: Any = None, env_cls: Any = None) -> Config:
    """A copy of `cfg` whose env section plays `env_cls` and whose agent section is `agent_cls`."""
    cfg = copy.deepcopy(cfg)
    if env_cls is not None:
        if cfg.custom_envs:
            raise ConfigError("env_cls= sets the env section, but custom_envs is set; register the class with "
                              "register_env and name it in custom_envs.<tag>.type")
        cfg.env.type = register_class(ENVS, env_cls, "env_cls")
    if agent_cls is not None:
        cfg.agent.type = register_class(AGENTS, agent_cls, "agent_cls")
    return cfg


def _config(config: ConfigSource, overrides: Sequence[str] | Mapping[str, Any]) -> Config:
    if isinstance(config, Config) and not overrides:
        return config
    return load_config(config, overrides)


def fit(config: ConfigSource = None, agent_cls: Any = None, env_cls: Any = None,
        tokenizer: Tokenizer | None = None, *, overrides: Sequence[str] | Mapping[str, Any] = (),
        resume: bool = False, overwrite: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train: `config` (a Config, dict or YAML path) with `overrides`; `agent_cls` / `env_cls`
    play the agent and env sections; `tokenizer` replaces the model's own (the embedded tiny
    model is then built on it); `overwrite` starts over in a run folder that holds a run (as the
    CLI's --overwrite). Returns the run's summary."""
    from agentrl.runtime.local import train as run

    cfg = with_classes(_config(config, overrides), agent_cls, env_cls)
    return run(cfg, resume=resume, log=log, tokenizer=tokenizer, overwrite=overwrite)


class AgentTrainer:
    """Seed 003's entry point (verl's RayPPOTrainer with a multi-turn rollout): build with a
    config and an agent class, `init_workers()`, then `fit()`. verl's worker, resource-pool and
    reward arguments are accepted and ignored with a one-line note: the parts are built in this
    process, and rewards come from the env."""

    def __init__(self, config: ConfigSource = None, tokenizer: Tokenizer | None = None, agent_cls: Any = None,
                 env_cls: Any = None, *, overrides: Sequence[str] | Mapping[str, Any] = (), resume: bool = False,
                 overwrite: bool = False, log: Callable[[str], None] = print, **kwargs: Any) -> None:
        unknown = [k for k in kwargs if k not in VERL_ARGS]
        if unknown:
            raise ConfigError(f"AgentTrainer: unknown argument '{unknown[0]}'; accepted: config, tokenizer, "
                              "agent_cls, env_cls, overrides, resume, overwrite, log "
                              f"(and verl's {', '.join(VERL_ARGS)}, ignored)")
        if kwargs:
            log(f"AgentTrainer: ignoring {', '.join(kwargs)} (verl's Ray workers and reward functions: agentrl "
                "places its parts by the config's runtime section (runtime.kind=ray: Ray actors) and takes rewards "
                "from the env)")
        self.config = with_classes(_config(config, overrides), agent_cls, env_cls)
        self.tokenizer = tokenizer
        self.resume = resume
        self.overwrite = overwrite
        self.log = log
        self.trainer: RunHandle | None = None  # built by init_workers(), spent by fit()
        self._run = ExitStack()

    def init_workers(self) -> None:
        """Build every part: envs, agents, model (warm-started when it is the embedded default),
        engine, actor, critic and trainer; writes the run folder's config.yaml."""
        from agentrl.runtime.local import open_run

        self._run = ExitStack()  # holds the run folder's lock until fit() ends
        self.trainer = self._run.enter_context(open_run(self.config, self.resume, self.log, self.tokenizer,
                                                                 self.overwrite))

    def fit(self) -> dict[str, Any]:
        """Train to `trainer.total_steps` (building the parts first if `init_workers` was not
        called); returns the run's summary."""
        if self.trainer is None:
            self.init_workers()
        trainer, self.trainer = self.trainer, None  # a fitted trainer is spent; fit() again rebuilds
        assert trainer is not None  # set by init_workers() (open_run returns a handle or raises)
        with self._run:
            return trainer.fit(resume=self.resume)
