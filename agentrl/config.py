"""The experiment schema: typed dataclasses, YAML loading, key=value overrides, validation.

One schema, defined once here: a YAML file only overrides these defaults, and so does each
`key=value` argument. Every field is documented by the string below it; `agentrl train --help`
prints those docs. Option names follow verl (`adv_estimator`, `clip_ratio_low`,
`loss_agg_mode`, `ppo_mini_batch_size`, `test_freq`, `save_freq`) and ROLL (`group_size`).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from agentrl.atomic import write_atomic
from agentrl.config_algo import (ActorConfig, AlgorithmConfig, CriticConfig, FilterGroupsConfig,  # noqa: F401
                                 KLControlConfig, PolicyLossConfig)
from agentrl.config_checks import BUILTIN_POLICY_LOSSES, validate  # noqa: F401  (BUILTIN_POLICY_LOSSES: re-exported)
from agentrl.config_model import LoraConfig, ModelConfig, TinyModelConfig, WarmStartConfig  # noqa: F401  (re-exported)
from agentrl.config_paths import expand_paths
from agentrl.config_runtime import RuntimeConfig
from agentrl.config_io import _all_keys, dataclass_docs, from_dict, parse_override, read_yaml, set_path
from agentrl.config_serve import EngineServing, ServeConfig
from agentrl.errors import ConfigError, shown
from agentrl.health import HealthConfig


# ---------------------------------------------------------------------------- env + agent
@dataclass
class EnvConfig:
    """Which environment the agent plays, and its arguments."""

    type: str = "frozen_lake"
    """Registered env name (see agentrl.registry.register_env)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env's constructor, e.g. {map_name: null, is_slippery: false}."""
    max_turns: int = 8
    """Most agent turns per episode; the episode ends as truncated after that."""


@dataclass
class AgentConfig:
    """The agent that turns observations into prompts and replies into actions."""

    type: str = "chat"
    """Registered agent name (see agentrl.registry.register_agent)."""
    system_prompt: Optional[str] = None
    """Optional system message; the env's instructions always open the first user message."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the agent's constructor, e.g. {turn_discount: 0.8} for math_retry."""


@dataclass
class CustomEnvConfig(EnvConfig):
    """One named env definition (ROLL's custom_envs entry): type, args, max_turns, and an agent."""

    agent: Optional[AgentConfig] = None
    """This env's own agent; null plays it with the top-level agent section."""


@dataclass
class EnvManagerConfig:
    """Which named envs a batch plays and how many groups of each (ROLL's env managers)."""

    tags: list[str] = field(default_factory=list)
    """Names from custom_envs (or the env section's type); empty = every defined env, in order."""
    n_groups: list[int] = field(default_factory=list)
    """Groups of each tag per batch, aligned with tags, summing to the batch's group count;
    empty = an even split."""


# ---------------------------------------------------------------------------- rollout
@dataclass
class RolloutConfig:
    """How episodes are sampled each step."""

    batch_size: int = 32
    """Episodes per training step (ROLL's rollout_batch_size); a multiple of group_size."""
    group_size: int = 8
    """Episodes per task sharing one env seed, compared with each other by group baselines."""
    temperature: float = 1.0
    """Sampling temperature; the trainer applies the same one when it recomputes logprobs."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int = -1
    """Sample among the k most likely tokens; -1 (or 0) turns it off."""
    max_new_tokens: int = 8
    """Most tokens per reply; a reply cut off there is treated as no answer (format penalty)."""
    rollout_filter_ratio: float = 1.0
    """RAGEN's variance filter: keep this fraction of groups, those with the largest reward std
    (1.0 keeps all)."""
    max_episode_tokens: int = 0
    """Most tokens the policy may generate in one episode, all turns together (a turn's
    max_new_tokens is cut to what is left); 0 = no limit. An episode that has spent it ends as
    truncated, with info truncation_reason=token_budget."""
    max_model_len: int = 0
    """Context limit of one episode, prompt and every turn, and the longest sequence the local
    engine serves (vLLM's name); 0 = the model's max_position_embeddings. An episode whose next
    prompt leaves no room to reply ends as truncated, with info truncation_reason=context."""
    max_staleness: int = 0
    """Asynchronous rollout (AReaL): 0 trains on-policy, collecting each step's episodes after the
    previous update; k >= 1 plays episodes for later steps in a background thread while the
    current step trains, and never trains at step t on an id generated by a policy older than
    t - k."""
    stale_samples: Literal["correct", "drop"] = "correct"
    """With max_staleness >= 1: correct samples from older policies with the decoupled PPO
    objective (actor.use_decoupled_loss, turned on unless actor.tis_imp_ratio_cap is set), or
    drop every group not generated wholly by the current policy."""
    episode_timeout: Optional[float] = 600.0
    """Seconds one episode attempt may take before it is ended as a timeout and retried (warm-start
    demonstrations and random play included). The default is far above a normal episode, so an env
    that hangs costs its step 10 minutes, not the run; a loop blocked that long by synchronous env
    code is left behind and its episode fails as a timeout. null: no limit (a hanging env then
    stalls the run; a warning after 10 minutes)."""
    max_retries: int = 1
    """Attempts after the first for an episode that failed (env/agent exception, engine error,
    timeout), each with a fresh env; when they run out the episode's whole group is dropped."""
    max_failed_fraction: float = 0.5
    """Training stops with an error when more than this fraction of a step's episodes failed
    every attempt (a broken env, not bad luck), and always when every one of them did; below it,
    failed groups are only dropped."""


# ---------------------------------------------------------------------------- engine
@dataclass
class EngineConfig(EngineServing):
    """The inference engine's knobs (vLLM's and SGLang's names). Until the next release each
    may also be set under its old name, rollout.<name>, with a deprecation warning."""

    max_num_seqs: int = 256
    """Most sequences the engine decodes at once (vLLM's name); further requests queue."""
    max_num_batched_tokens: int = 8192
    """Most positions (padding included) of one prefill pass of the engine; a longer
    prompt is prefilled in chunks over several steps (vLLM's name)."""
    max_total_tokens: Optional[int] = None
    """KV-cache budget of the engine in tokens (SGLang's name): a running sequence counts
    its prompt + max_new_tokens, a parked prefix cache its length; requests beyond it queue.
    null = max_num_seqs * the context limit."""
    enable_prefix_caching: bool = True
    """Keep each episode's KV between turns and share prompt prefixes (a GRPO group's first
    prompt), so that only new ids are prefilled (vLLM's name)."""
    kv_on_weight_update: Literal["recompute", "keep"] = "recompute"
    """After a weight update, KV computed under older weights is recomputed (running sequences
    re-prefill, parked prefix caches are dropped) or kept and reported in Completion.kv_version."""
    enforce_eager: bool = False
    """vLLM's name. On CUDA the engine replays its decode pass as CUDA graphs captured per padded
    batch size (a pass of a small model is bound by kernel launches); true runs every pass
    eagerly. On CPU every pass is eager either way."""


# ---------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    """Loop length, evaluation, checkpoints and logging."""

    total_steps: int = 60
    """Training steps (one rollout batch and one update each)."""
    test_freq: int = 10
    """Evaluate every N steps (and always before and after training); 0 = only before/after."""
    eval_episodes: int = 32
    """Held-out episodes per evaluation, decoded greedily."""
    save_freq: int = 20
    """Checkpoint every N steps (and at the end); 0 = only at the end."""
    max_checkpoints: int = 2
    """Checkpoints kept in the run folder; older ones are deleted."""
    logger: list[Literal["console", "jsonl", "tensorboard", "wandb"]] = field(
        default_factory=lambda: ["console", "jsonl", "tensorboard"])
    """Metric sinks: console (progress bar), jsonl, tensorboard, wandb (offline unless WANDB_MODE is set)."""
    progress: bool = True
    """Show a live progress bar."""
    dump_trajectories_freq: int = 0
    """Dump the training batch every N steps (and at the last) to run_dir/dumps for `agentrl view`; 0 = off."""
    dump_max_tokens: int = 65536
    """Most tokens one step's dump keeps (whole groups, in batch order): bounds its size."""
    on_collapse: Literal["warn", "stop"] = "warn"
    """What a collapse alarm (health section) does: warn (one line, training goes on) or stop (back to the
    last healthy checkpoint, then exit with the reason)."""


@dataclass
class Config:
    """A whole experiment."""

    exp_name: str = "frozen_lake"
    """Name of the experiment; the run folder is output_dir/exp_name unless run_dir is set."""
    seed: int = 0
    """Seed of everything (model init, env seeds, sampling); same seed, same metrics on CPU."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto uses CUDA when present."""
    output_dir: str = "runs"
    """Parent folder of run folders."""
    run_dir: Optional[str] = None
    """Exact run folder (overrides output_dir/exp_name)."""
    imports: list[str] = field(default_factory=list)
    """Python modules or .py files imported before the run is built, e.g. one that registers its
    own envs and agents with register_env / register_agent; a file is imported as the module of
    its own name (path/my_agent.py: my_agent), which no other module may hold."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment of a one-env run, tagged by its type; leave it at its defaults when
    custom_envs is used."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The agent (of every env that names none of its own)."""
    custom_envs: dict[str, CustomEnvConfig] = field(default_factory=dict)
    """Named env definitions (ROLL's custom_envs), each {type, args, max_turns, agent}; the
    names are the tags that env managers pick and that metrics are logged under (env/<tag>/)."""
    train_env_manager: EnvManagerConfig = field(default_factory=EnvManagerConfig)
    """Tags of training batches: rollout.batch_size / rollout.group_size groups of
    rollout.group_size episodes that share one env seed."""
    val_env_manager: EnvManagerConfig = field(default_factory=EnvManagerConfig)
    """Tags of evaluation: trainer.eval_episodes greedy episodes, one per group (n_groups counts
    episodes); empty tags = the training tags."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Episode sampling."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The inference engine that serves the episodes' generation."""
    serve: ServeConfig = field(default_factory=ServeConfig)
    """`agentrl serve`: the policy's HTTP server."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy optimisation."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (GAE)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, evaluation, checkpoints, logging."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """Collapse alarms: thresholds of the health/ signals (agentrl/health.py)."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Where the parts run: this process (local) or Ray actors placed ROLL-style (ray)."""

    def resolved_run_dir(self) -> Path:
        """The folder this run writes to."""
        return Path(self.run_dir) if self.run_dir else Path(self.output_dir) / self.exp_name

    def env_definitions(self) -> dict[str, CustomEnvConfig]:
        """Every named env of the run: custom_envs, or the env section under its type's name."""
        if self.custom_envs:
            return dict(self.custom_envs)
        e = self.env
        return {e.type: CustomEnvConfig(type=e.type, args=dict(e.args), max_turns=e.max_turns)}

    def agent_for(self, tag: str) -> AgentConfig:
        """The agent section that plays `tag`."""
        return self.env_definitions()[tag].agent or self.agent

    def group_tags(self, split: Literal["train", "val"]) -> list[str]:
        """The tag of each group of a training batch or of an evaluation, in order."""
        tags, counts = self._group_counts(split)
        return [tag for tag, n in zip(tags, counts) for _ in range(n)]

    def max_turns(self) -> int:
        """The most agent turns any env of the run allows."""
        return max(d.max_turns for d in self.env_definitions().values())

    def _group_counts(self, split: str) -> tuple[list[str], list[int]]:
        manager = self.train_env_manager if split == "train" else self.val_env_manager
        name = f"{split}_env_manager"
        if split == "train":
            total, what = self.rollout.batch_size // self.rollout.group_size, (
                f"rollout.batch_size={self.rollout.batch_size} / rollout.group_size={self.rollout.group_size}")
        else:
            total, what = self.trainer.eval_episodes, f"trainer.eval_episodes={self.trainer.eval_episodes}"
        tags = list(manager.tags) or (self._group_counts("train")[0] if split == "val"
                                      else list(self.env_definitions()))
        if not manager.n_groups:
            if total % len(tags):
                raise ConfigError(f"{what} gives {total} groups, which do not split evenly over {len(tags)} "
                                  f"tags {tags}; set {name}.n_groups (one count per tag)")
            return tags, [total // len(tags)] * len(tags)
        if len(manager.n_groups) != len(tags):
            raise ConfigError(f"{name}.n_groups has {len(manager.n_groups)} entries but {name}.tags has "
                              f"{len(tags)} ({tags}); give one group count per tag")
        if sum(manager.n_groups) != total:
            raise ConfigError(f"{name}.n_groups={manager.n_groups} sums to {sum(manager.n_groups)} groups, "
                              f"but {what} gives {total}")
        return tags, list(manager.n_groups)


# ---------------------------------------------------------------------------- loading
def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Build a Config from defaults, an optional YAML file, then `key=value` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        data = moved_keys(read_yaml(path), str(path))
    cfg = from_dict(Config, data, prefix="")
    for item in overrides:
        key, value = parse_override(item)
        set_path(cfg, new_name(key), value)
    validate(cfg)
    resolve(cfg)
    return cfg


# Keys that moved, old -> new: the old names work for one release, with a warning.
MOVED = {f"rollout.{k}": f"engine.{k}" for k in ("max_num_seqs", "max_num_batched_tokens", "max_total_tokens",
                                                 "enable_prefix_caching", "kv_on_weight_update")}
_WARNED: set[str] = set()


def new_name(key: str) -> str:
    """The current name of a dotted key (a moved one is renamed, with a one-line warning)."""
    if key not in MOVED:
        return key
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"agentrl: warning: {key} is deprecated; use {MOVED[key]} (the old name will be removed in the "
              "next release)", file=sys.stderr, flush=True)
    return MOVED[key]


def moved_keys(data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` (a YAML file's mapping) with moved keys under their new names."""
    old_section = data.get("rollout")
    if not isinstance(old_section, dict) or not any(f"rollout.{k}" in MOVED for k in old_section):
        return data
    data = {**data, "rollout": dict(old_section)}
    engine = data["engine"] = dict(data.get("engine") or {})
    for key in [k for k in data["rollout"] if f"rollout.{k}" in MOVED]:
        value = data["rollout"].pop(key)
        if key in engine and engine[key] != value:
            raise ConfigError(f"{source}: rollout.{key}={shown(value)} and engine.{key}={shown(engine[key])} disagree; "
                              f"rollout.{key} is the deprecated name of engine.{key}: keep only engine.{key}")
        engine[key] = value
        new_name(f"rollout.{key}")
    return data


def resolve(cfg: Config) -> None:
    """Set what other fields imply, so the saved config says what the run does."""
    expand_paths(cfg)
    r, a = cfg.rollout, cfg.actor
    if r.max_staleness > 0 and r.stale_samples == "correct" and a.tis_imp_ratio_cap <= 0:
        a.use_decoupled_loss = True  # stale samples need an off-policy correction


def all_keys() -> list[str]:
    """Every valid dotted config key."""
    return _all_keys(Config)


# ---------------------------------------------------------------------------- output
def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML and hashing)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (whole or not at all: a resume rewrites it and reads it back)."""
    write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def field_docs(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for every field, read from the docstrings below the fields."""
    return dataclass_docs(cls, prefix)
