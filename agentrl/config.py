"""The experiment schema: typed dataclasses, YAML loading, key=value overrides, validation.

One schema, defined once here: a YAML file only overrides these defaults, and so does each
`key=value` argument. Every field is documented by the string below it; `agentrl train --help`
prints those docs. Option names follow verl (`adv_estimator`, `clip_ratio_low`,
`loss_agg_mode`, `ppo_mini_batch_size`, `test_freq`, `save_freq`) and ROLL (`group_size`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from agentrl.config_io import _all_keys, dataclass_docs, from_dict, parse_override, read_yaml, set_path
from agentrl.config_limits import check_limits
from agentrl.errors import ConfigError, did_you_mean


# ---------------------------------------------------------------------------- model
@dataclass
class TinyModelConfig:
    """Shape of the embedded default model (a transformers Qwen2 causal LM)."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_hidden_layers: int = 2
    """Number of transformer blocks."""
    num_attention_heads: int = 4
    """Query heads per block."""
    num_key_value_heads: int = 2
    """Key/value heads per block (grouped-query attention)."""
    intermediate_size: int = 512
    """Width of the MLP."""
    vocab_size: int = 512
    """Size of the byte-level BPE vocabulary trained locally on the env's text."""
    max_position_embeddings: int = 2048
    """Longest sequence the model accepts (prompt plus every turn)."""


@dataclass
class WarmStartConfig:
    """Supervised warm start of the tiny model on the env's reply format."""

    max_steps: int = 400
    """Upper bound on SFT steps; training stops earlier once the loss reaches the floor."""
    batch_size: int = 16
    """Demonstration episodes per SFT step."""
    lr: float = 3e-3
    """AdamW learning rate of the warm start."""
    floor_tolerance: float = 0.02
    """Stop when the loss is within this (nats per reply token) of the uniform-action floor."""
    patience: int = 3
    """Consecutive steps at the floor needed to stop."""
    min_steps: int = 0
    """Train at least this many steps, floor or not."""
    observation_loss: bool = True
    """Also learn to predict the env's own text (observations, template); this builds the
    attention that reads observations, which reply-only demonstrations teach the model to ignore."""


@dataclass
class ModelConfig:
    """The policy model: a local Hugging Face directory, or the embedded tiny default."""

    path: Optional[str] = None
    """Local directory in Hugging Face layout; None builds and warm-starts the embedded tiny model."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype. float32 keeps engine and trainer logprobs equal; bfloat16 drifts by ~1e-2."""
    cache_dir: Optional[str] = None
    """Where warm-started tiny models are cached by config hash (default ~/.cache/agentrl)."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the embedded default model."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Warm start of the embedded default model."""


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
    max_num_seqs: int = 256
    """Most sequences the local engine decodes at once (vLLM's name); further requests queue."""
    max_num_batched_tokens: int = 8192
    """Most positions (padding included) of one prefill pass of the local engine; a longer
    prompt is prefilled in chunks over several steps (vLLM's name)."""
    max_total_tokens: Optional[int] = None
    """KV-cache budget of the local engine in tokens (SGLang's name): a running sequence counts
    its prompt + max_new_tokens, a parked prefix cache its length; requests beyond it queue.
    null = max_num_seqs * the context limit."""
    enable_prefix_caching: bool = True
    """Keep each episode's KV between turns and share prompt prefixes (a GRPO group's first
    prompt), so that only new ids are prefilled (vLLM's name)."""
    kv_on_weight_update: Literal["recompute", "keep"] = "recompute"
    """After a weight update, KV computed under older weights is recomputed (running sequences
    re-prefill, parked prefix caches are dropped) or kept and reported in Completion.kv_version."""
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
    episode_timeout: Optional[float] = None
    """Seconds one episode attempt may take before it is ended as a timeout (null: no limit)."""
    max_retries: int = 1
    """Attempts after the first for an episode that failed (env/agent exception, engine error,
    timeout), each with a fresh env; when they run out the episode's whole group is dropped."""
    max_failed_fraction: float = 0.5
    """Training stops with an error when more than this fraction of a step's episodes failed
    every attempt (a broken env, not bad luck); below it, failed groups are only dropped."""


# ---------------------------------------------------------------------------- algorithm
@dataclass
class KLControlConfig:
    """Coefficient of the KL penalty in the reward (verl's algorithm.kl_ctrl)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    """fixed keeps kl_coef; adaptive moves it towards target_kl (Ziegler et al. 2019)."""
    kl_coef: float = 0.001
    """Initial (or fixed) coefficient."""
    horizon: int = 10000
    """Adaptive controller horizon, in samples."""
    target_kl: float = 0.1
    """Adaptive controller target KL per sequence."""


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's algorithm.filter_groups)."""

    enable: bool = False
    """Drop groups whose episodes all got the same metric value (they carry no group signal)."""
    metric: Literal["reward", "success"] = "reward"
    """What must vary within a group: total reward, or success."""
    max_num_gen_batches: int = 0
    """Collect up to this many batches per step to refill dropped groups; 0 = no refill."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation."""

    adv_estimator: str = "grpo"
    """Registered advantage estimator: grpo, rloo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, gae (needs critic.enable=true), gigpo, and verl's episode-level
    opo, grpo_passk (group_size >= 2), gpg, remax (leave-one-out baseline, no greedy rollout)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's reward std; false gives Dr. GRPO."""
    credit: Literal["outcome", "token", "turn"] = "turn"
    """turn: each turn is credited with its discounted return from that turn on (gamma, lam per
    turn); token: verl's semantics, rewards where the env gave them, gamma and lam per generated
    token; outcome: each episode's summed reward on its last generated token, then as token."""
    gamma: float = 1.0
    """Discount: per agent turn (credit=turn) or per generated token (token/outcome)."""
    lam: float = 1.0
    """GAE lambda (verl's algorithm.lam)."""
    step_adv_weight: float = 1.0
    """GiGPO: weight of the step-level (same-state) advantage added to the episode-level one."""
    episode_adv_weight: float = 1.0
    """GiGPO: weight of the episode-level advantage; 0 leaves only same-state comparisons."""
    use_kl_in_reward: bool = False
    """Subtract kl_ctrl.kl_coef * KL(policy || reference) from each generated token's reward."""
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl"] = "kl"
    """KL estimator for the reward penalty."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Coefficient of the reward penalty."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling."""


@dataclass
class PolicyLossConfig:
    """The policy loss (verl's actor_rollout_ref.actor.policy_loss)."""

    loss_mode: str = "vanilla"
    """Registered policy loss: vanilla (PPO clip, dual-clip), gspo (sequence-level ratio), cispo
    (clipped IS weight, no token dropped), sapo (soft sigmoid gate), gmpo or geo_mean
    (geometric-mean ratio), gpg (plain policy gradient); see agentrl/algos/policy_losses.py."""
    tau_pos: float = 1.0
    """SAPO: gate temperature for tokens with positive advantage."""
    tau_neg: float = 1.05
    """SAPO: gate temperature for tokens with zero or negative advantage."""


@dataclass
class ActorConfig:
    """Policy optimisation (verl's actor_rollout_ref.actor)."""

    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """AdamW betas."""
    lr_scheduler_type: Literal["constant", "cosine"] = "cosine"
    """Learning-rate schedule over trainer.total_steps (verl's warmup_style): cosine decays to
    min_lr_ratio * lr, so a policy that has converged stops taking lr-sized Adam steps on the
    noise of near-zero advantages (measured: a solved FrozenLake run broke on its last step)."""
    lr_warmup_steps_ratio: float = 0.0
    """Fraction of trainer.total_steps over which the learning rate ramps up linearly."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule, as a fraction of lr."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    ppo_mini_batch_size: int = 16
    """Episodes per optimizer step; the batch is split into batch_size / this updates."""
    micro_batch_size: int = 16
    """Episodes per forward/backward (gradient accumulation inside a mini-batch)."""
    clip_ratio_low: float = 0.2
    """PPO clip range below 1 (ratio >= 1 - clip_ratio_low)."""
    clip_ratio_high: float = 0.2
    """PPO clip range above 1 (ratio <= 1 + clip_ratio_high); DAPO's clip-higher raises it."""
    clip_ratio_c: Optional[float] = 3.0
    """Dual-clip bound (> 1) for negative advantages, as verl; null turns it off."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-sum-token-sum-norm", "seq-mean-token-sum-norm"] = "token-mean"
    """How token losses are averaged (verl's modes). seq-mean-token-sum-norm is verl's and Dr.
    GRPO's: episodes' summed token losses, averaged over the mini-batch's episodes, /
    loss_scale_factor; seq-sum-token-sum-norm is verl's legacy form, without the episode mean."""
    loss_scale_factor: Optional[float] = None
    """Constant divisor of the *-token-sum-norm modes; null = the most tokens an episode
    can generate (rollout.max_new_tokens * env.max_turns), our padded response length."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Which policy loss (verl's actor.policy_loss)."""
    grad_clip: float = 1.0
    """Max global grad norm; 0 turns clipping off."""
    use_kl_loss: bool = False
    """Add a KL-to-reference term to the loss (the reference is the starting policy, frozen)."""
    kl_loss_coef: float = 0.05
    """Weight of the KL loss."""
    kl_loss_type: Literal["kl", "abs", "mse", "low_var_kl"] = "low_var_kl"
    """KL estimator: kl (k1), abs, mse (k2), low_var_kl (k3, clamped as verl does)."""
    tis_imp_ratio_cap: float = -1.0
    """Truncated importance sampling (verl): weight each token by min(pi_old / pi_behaviour,
    cap), correcting engine/trainer mismatch; <= 0 turns it off."""
    use_decoupled_loss: bool = False
    """AReaL's decoupled PPO: clip against the proximal policy (recomputed before the update)
    and weight by pi_prox / pi_behaviour, for stale samples."""
    behav_imp_weight_cap: Optional[float] = None
    """Decoupled PPO: tokens whose behaviour weight exceeds this are dropped; null = no cap."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (token-mean over generated ids); keeps a policy from
    collapsing onto one action before it has learned which state calls for which."""


@dataclass
class CriticConfig:
    """The value model for GAE (verl's critic)."""

    enable: bool = False
    """Build and train a critic; adv_estimator=gae requires it."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    ppo_mini_batch_size: int = 16
    """Episodes per optimizer step."""
    micro_batch_size: int = 16
    """Episodes per forward/backward."""
    cliprange_value: float = 0.5
    """Value clipping around the values computed before the update."""
    grad_clip: float = 1.0
    """Max global grad norm; 0 turns clipping off."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-sum-token-sum-norm", "seq-mean-token-sum-norm"] = "token-mean"
    """How token value losses are averaged (as actor.loss_agg_mode)."""


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
    logger: list[Literal["console", "jsonl", "tensorboard"]] = field(
        default_factory=lambda: ["console", "jsonl", "tensorboard"])
    """Metric sinks: console (progress bar), jsonl, tensorboard."""
    progress: bool = True
    """Show a live progress bar."""


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
    own envs and agents with register_env / register_agent."""
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
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy optimisation."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (GAE)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, evaluation, checkpoints, logging."""

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
        data = read_yaml(path)
    cfg = from_dict(Config, data, prefix="")
    for item in overrides:
        key, value = parse_override(item)
        set_path(cfg, key, value)
    validate(cfg)
    resolve(cfg)
    return cfg


def resolve(cfg: Config) -> None:
    """Set what other fields imply, so the saved config says what the run does."""
    r, a = cfg.rollout, cfg.actor
    if r.max_staleness > 0 and r.stale_samples == "correct" and a.tis_imp_ratio_cap <= 0:
        a.use_decoupled_loss = True  # stale samples need an off-policy correction


def all_keys() -> list[str]:
    """Every valid dotted config key."""
    return _all_keys(Config)


# ---------------------------------------------------------------------------- validation
def validate(cfg: Config) -> None:
    """Reject impossible combinations before any work starts."""
    r, a, t = cfg.rollout, cfg.actor, cfg.trainer
    check_limits(cfg)  # first: every size below is bounded before anything is built from it
    _positive(r, "rollout", "batch_size", "group_size", "max_new_tokens", "max_num_seqs")
    _positive(a, "actor", "ppo_epochs", "ppo_mini_batch_size", "micro_batch_size")
    _positive(t, "trainer", "total_steps", "eval_episodes", "max_checkpoints")
    _positive(cfg.env, "env", "max_turns")
    if r.max_episode_tokens < 0 or r.max_model_len < 0:
        raise ConfigError("rollout.max_episode_tokens and rollout.max_model_len must be >= 0 (0 = no limit)")
    if r.batch_size % r.group_size:
        raise ConfigError(
            f"rollout.batch_size={r.batch_size} is not a multiple of rollout.group_size={r.group_size}; "
            f"use a batch_size like {max(1, r.batch_size // r.group_size) * r.group_size}"
        )
    if r.batch_size % a.ppo_mini_batch_size:
        raise ConfigError(
            f"rollout.batch_size={r.batch_size} is not a multiple of actor.ppo_mini_batch_size="
            f"{a.ppo_mini_batch_size}"
        )
    if a.ppo_mini_batch_size % a.micro_batch_size:
        raise ConfigError(
            f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size} is not a multiple of "
            f"actor.micro_batch_size={a.micro_batch_size}"
        )
    if not 0.0 < r.top_p <= 1.0:
        raise ConfigError(f"rollout.top_p={r.top_p} must be in (0, 1]")
    if r.temperature <= 0:
        raise ConfigError(f"rollout.temperature={r.temperature} must be > 0 (eval decodes greedily)")
    if r.top_k < -1:
        raise ConfigError(f"rollout.top_k={r.top_k} must be -1 (off) or a positive count")
    if r.max_staleness < 0:
        raise ConfigError(f"rollout.max_staleness={r.max_staleness} must be >= 0 (0 = on-policy)")
    if r.episode_timeout is not None and r.episode_timeout <= 0:
        raise ConfigError(f"rollout.episode_timeout={r.episode_timeout} must be > 0 seconds (or null: no limit)")
    if r.max_retries < 0:
        raise ConfigError(f"rollout.max_retries={r.max_retries} must be >= 0")
    if not 0.0 <= r.max_failed_fraction <= 1.0:
        raise ConfigError(f"rollout.max_failed_fraction={r.max_failed_fraction} must be in [0, 1]")
    _positive(r, "rollout", "max_num_batched_tokens")
    if r.max_total_tokens is not None and r.max_total_tokens < 2:
        raise ConfigError(f"rollout.max_total_tokens={r.max_total_tokens} must be at least 2 tokens (or null for the default)")
    for name in ("clip_ratio_low", "clip_ratio_high", "lr", "weight_decay", "grad_clip"):
        if getattr(a, name) < 0:
            raise ConfigError(f"actor.{name}={getattr(a, name)} must be >= 0")
    if not 0.0 <= a.min_lr_ratio <= 1.0:
        raise ConfigError(f"actor.min_lr_ratio={a.min_lr_ratio} must be in [0, 1]")
    if not 0.0 <= a.lr_warmup_steps_ratio < 1.0:
        raise ConfigError(f"actor.lr_warmup_steps_ratio={a.lr_warmup_steps_ratio} must be in [0, 1)")
    if len(a.betas) != 2 or not all(0 <= b < 1 for b in a.betas):
        raise ConfigError(f"actor.betas={a.betas} must be two numbers in [0, 1)")
    if not 0.0 <= cfg.algorithm.gamma <= 1.0:
        raise ConfigError(f"algorithm.gamma={cfg.algorithm.gamma} must be in [0, 1]")
    _validate_algorithm(cfg)
    _validate_env_groups(cfg)
    if t.test_freq < 0 or t.save_freq < 0:
        raise ConfigError("trainer.test_freq and trainer.save_freq must be >= 0")
    if cfg.model.path is not None and not Path(cfg.model.path).expanduser().is_dir():
        raise ConfigError(f"model.path={cfg.model.path!r}: no such directory (expected a local "
                          "Hugging Face model folder with config.json)")


def _validate_algorithm(cfg: Config) -> None:
    # adv_estimator names are checked against the registry when the runtime builds the run.
    alg, a, c = cfg.algorithm, cfg.actor, cfg.critic
    if alg.adv_estimator == "gae" and not c.enable:
        raise ConfigError("algorithm.adv_estimator=gae needs a value model: set critic.enable=true "
                          "(and critic.lr, critic.cliprange_value as needed)")
    if c.enable:
        _positive(c, "critic", "ppo_epochs", "ppo_mini_batch_size", "micro_batch_size")
        if cfg.rollout.batch_size % c.ppo_mini_batch_size or c.ppo_mini_batch_size % c.micro_batch_size:
            raise ConfigError(f"critic.ppo_mini_batch_size={c.ppo_mini_batch_size} must divide rollout.batch_size="
                              f"{cfg.rollout.batch_size} and be a multiple of critic.micro_batch_size="
                              f"{c.micro_batch_size}")
    if not 0.0 <= alg.lam <= 1.0:
        raise ConfigError(f"algorithm.lam={alg.lam} must be in [0, 1]")
    if a.clip_ratio_c is not None and a.clip_ratio_c <= 1.0:
        raise ConfigError(f"actor.clip_ratio_c={a.clip_ratio_c} must be > 1 (or null to turn dual-clip off)")
    if a.use_decoupled_loss and a.tis_imp_ratio_cap > 0:
        raise ConfigError("actor.use_decoupled_loss=true and actor.tis_imp_ratio_cap>0 both reweight by "
                          "pi_old / pi_behaviour; choose one")
    if a.behav_imp_weight_cap is not None and a.behav_imp_weight_cap <= 1.0:
        raise ConfigError(f"actor.behav_imp_weight_cap={a.behav_imp_weight_cap} must be > 1 (or null)")
    if not 0.0 < cfg.rollout.rollout_filter_ratio <= 1.0:
        raise ConfigError(f"rollout.rollout_filter_ratio={cfg.rollout.rollout_filter_ratio} must be in (0, 1]")
    if alg.kl_ctrl.kl_coef < 0 or alg.kl_ctrl.horizon <= 0 or alg.kl_ctrl.target_kl <= 0:
        raise ConfigError("algorithm.kl_ctrl: kl_coef must be >= 0, horizon and target_kl > 0")
    if a.loss_scale_factor is not None and a.loss_scale_factor <= 0:
        raise ConfigError(f"actor.loss_scale_factor={a.loss_scale_factor} must be > 0 (or null)")
    _validate_policy_loss(cfg)


# The modes agentrl.algos.policy_losses registers; named here so that a config error needs no torch.
BUILTIN_POLICY_LOSSES = ("cispo", "geo_mean", "gmpo", "gpg", "gspo", "sapo", "vanilla")


def _validate_policy_loss(cfg: Config) -> None:
    """actor.policy_loss: a known loss mode (user modes may come from `imports`), positive taus."""
    from agentrl.registry import POLICY_LOSSES

    p = cfg.actor.policy_loss
    if p.tau_pos <= 0 or p.tau_neg <= 0:
        raise ConfigError(f"actor.policy_loss.tau_pos={p.tau_pos} and tau_neg={p.tau_neg} must be > 0")
    known = sorted(set(BUILTIN_POLICY_LOSSES) | set(POLICY_LOSSES.names()))
    # A module in `imports` may register more modes: those are checked once it is imported.
    if not cfg.imports and p.loss_mode not in known:
        raise ConfigError(f"actor.policy_loss.loss_mode: unknown policy loss mode '{p.loss_mode}'."
                          f"{did_you_mean(p.loss_mode, known)} Known: {', '.join(known)}")
    if cfg.algorithm.adv_estimator == "grpo_passk" and cfg.rollout.group_size < 2:
        raise ConfigError(f"algorithm.adv_estimator=grpo_passk compares the two best episodes of a group: "
                          f"set rollout.group_size >= 2 (got {cfg.rollout.group_size})")


def _validate_env_groups(cfg: Config) -> None:
    """Named envs and the tags and group counts of both env managers."""
    if cfg.custom_envs and cfg.env != EnvConfig():
        raise ConfigError("both env and custom_envs are set: env is the shorthand for a one-env run; with "
                          "custom_envs, define every env there and leave env at its defaults")
    for name, definition in cfg.custom_envs.items():
        if not name or "/" in name or name != name.strip():
            raise ConfigError(f"custom_envs name {name!r} must be non-empty, without '/' or outer spaces "
                              "(it becomes the metric prefix env/<name>/)")
        _positive(definition, f"custom_envs.{name}", "max_turns")
    known = list(cfg.env_definitions())
    for split in ("train", "val"):
        manager = getattr(cfg, f"{split}_env_manager")
        for tag in manager.tags:
            if tag not in known:
                raise ConfigError(f"{split}_env_manager.tags: unknown tag '{tag}'.{did_you_mean(tag, known)} "
                                  f"Defined: {', '.join(known)}")
        if len(set(manager.tags)) != len(manager.tags):
            raise ConfigError(f"{split}_env_manager.tags={manager.tags} names a tag twice; give each tag once "
                              "with its count in n_groups")
        bad = [n for n in manager.n_groups if n < 1]
        if bad:
            raise ConfigError(f"{split}_env_manager.n_groups={manager.n_groups}: every count must be >= 1 "
                              "(leave a tag out instead)")
        cfg.group_tags(split)  # raises on a count mismatch or an uneven split


def _positive(section: Any, name: str, *keys: str) -> None:
    for key in keys:
        value = getattr(section, key)
        if value <= 0:
            raise ConfigError(f"{name}.{key}={value} must be a positive integer")


# ---------------------------------------------------------------------------- output
def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML and hashing)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def field_docs(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for every field, read from the docstrings below the fields."""
    return dataclass_docs(cls, prefix)
