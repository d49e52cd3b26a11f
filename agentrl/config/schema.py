"""The experiment schema: `Config`, the whole experiment, and its sections of envs, agents, rollout
and trainer (the other sections have modules of their own: algo.py, model.py, engine.py,
serve.py, runtime.py; health's is agentrl/health.py).

One schema, defined once: a YAML file only overrides these defaults, and so does each `key=value`
argument (loading.py). Every field is documented by the string below it; `agentrl train --help`
prints those docs. Option names follow verl (`adv_estimator`, `clip_ratio_low`,
`loss_agg_mode`, `ppo_mini_batch_size`, `test_freq`, `save_freq`) and ROLL (`group_size`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl.config.algo import ActorConfig, AlgorithmConfig, CriticConfig
from agentrl.config.engine import EngineConfig
from agentrl.config.model import ModelConfig
from agentrl.config.runtime import RuntimeConfig
from agentrl.config.serve import ServeConfig
from agentrl.errors import ConfigError
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
    system_prompt: str | None = None
    """Optional system message; the env's instructions always open the first user message."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the agent's constructor, e.g. {turn_discount: 0.8} for math_retry."""


@dataclass
class CustomEnvConfig(EnvConfig):
    """One named env definition (ROLL's custom_envs entry): type, args, max_turns, and an agent."""

    agent: AgentConfig | None = None
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
class CurriculumConfig:
    """Curricula (agentrl/rollout/curriculum.py): each training group's task is drawn from a finite
    pool by a running estimate of its success, so episodes go where the group signal is (prime-rl's
    difficulty pools; RAGEN's signal filter, before the episodes are played instead of after)."""

    enable: bool = False
    """Draw each group's task from the pool; off, every group plays a fresh env seed."""
    pool_size: int = 512
    """Tasks (env seeds) in each env tag's pool; a task comes back, so its estimate means something."""
    ema: float = 0.5
    """Weight of a task's newest group in its success estimate: estimate <- (1 - ema) * estimate +
    ema * the group's success rate (its first group sets it); 1.0 keeps the latest group's alone."""
    hard_threshold: float = 0.0
    """prime-rl's name: a task whose estimate is at or below this is hard, left to the uniform draws."""
    easy_threshold: float = 1.0
    """prime-rl's name: a task whose estimate is at or above this is easy, left to the uniform draws."""
    uniform_ratio: float = 0.25
    """Share of groups drawn uniformly from the whole pool, seen or not (the floor that keeps every
    task in play); the others are drawn among seen tasks by `rule`."""
    rule: str = "informative"
    """Weight of a seen task between the thresholds in the other draws: informative, the chance that a
    group of rollout.group_size episodes is neither all solved nor all failed under its estimate
    p (1 - p^n - (1 - p)^n); or a function registered with
    agentrl.registry.register_curriculum_rule in a module of `imports`, called as
    rule(estimate, seen, group_size) -> weight (0 leaves the task out)."""


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
    episode_timeout: float | None = 600.0
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
    on_truncation: Literal["zero", "bootstrap", "drop"] = "zero"
    """What a truncated episode (ended by max_turns, its token budget, the context, or the env's
    own truncation: any `truncation_reason`) means for training. zero: it earns the rewards it got
    and nothing after its end (the return of a terminated episode). bootstrap: the critic's value
    of its last state stands for what it would have earned after (needs a critic:
    algorithm.adv_estimator=gae). drop: it leaves its group before advantages, which are computed
    over the group's other episodes (a group left empty is dropped); counted in
    rollout/dropped_truncated."""
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    """Which tasks the training groups play: off (fresh env seeds), or a curriculum."""

    @property
    def groups_per_step(self) -> int:
        """Groups of one training step: batch_size / group_size (validation makes it exact)."""
        return self.batch_size // self.group_size


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
    run_dir: str | None = None
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
            total, what = self.rollout.groups_per_step, (
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
