"""The experiment schema: typed dataclasses, YAML loading, key=value overrides, validation.

One schema, defined once here: a YAML file only overrides these defaults, and so does each
`key=value` argument. Every field is documented by the string below it; `agentrl train --help`
prints those docs. Option names follow verl (`adv_estimator`, `clip_ratio_low`,
`loss_agg_mode`, `ppo_mini_batch_size`, `test_freq`, `save_freq`) and ROLL (`group_size`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

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
    null = max_num_seqs * max_model_len."""
    max_model_len: Optional[int] = None
    """Longest sequence (prompt + reply) the engine serves (vLLM's name); a reply reaching it ends
    with finish_reason length. null = the model's max_position_embeddings."""
    enable_prefix_caching: bool = True
    """Keep each episode's KV between turns and share prompt prefixes (a GRPO group's first
    prompt), so that only new ids are prefilled (vLLM's name)."""
    kv_on_weight_update: Literal["recompute", "keep"] = "recompute"
    """After a weight update, KV computed under older weights is recomputed (running sequences
    re-prefill, parked prefix caches are dropped) or kept and reported in Completion.kv_version."""
    rollout_filter_ratio: float = 1.0
    """RAGEN's variance filter: keep this fraction of groups, those with the largest reward std
    (1.0 keeps all)."""


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
    reinforce_plus_plus_baseline, gae (needs critic.enable=true), gigpo."""
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
                           "seq-mean-token-sum-norm"] = "token-mean"
    """How token losses are averaged (verl's modes); seq-mean-token-sum-norm is Dr. GRPO's."""
    loss_scale_factor: Optional[float] = None
    """Constant divisor of seq-mean-token-sum-norm; null = the most tokens an episode can
    generate (rollout.max_new_tokens * env.max_turns)."""
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
                           "seq-mean-token-sum-norm"] = "token-mean"
    """How token value losses are averaged."""


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
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
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
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The agent."""
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
    return cfg


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with one-line errors for a missing file or bad syntax."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"YAML syntax error in {p}{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of config keys, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """Split 'a.b=value' and parse the value as YAML (so 3 is int, true is bool, [1,2] a list)."""
    key, sep, raw = item.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not key:
        raise ConfigError(f"override '{item}' must look like key=value, e.g. trainer.total_steps=20")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def from_dict(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """Build dataclass `cls` from a nested dict, checking every key and type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    obj = cls()
    for key, value in data.items():
        set_path(obj, f"{key}", value, prefix=prefix)
    return obj


def set_path(obj: Any, dotted: str, value: Any, prefix: str = "") -> None:
    """Set `obj.a.b = value` with type checking; unknown keys suggest the closest valid key."""
    head, _, rest = dotted.partition(".")
    full = prefix + head
    fields = {f.name: f for f in dataclasses.fields(obj)}
    if head not in fields:
        valid = [prefix + name for name in fields]
        hint = did_you_mean(full, _all_keys(type(obj), prefix)) or did_you_mean(full, valid)
        raise ConfigError(f"unknown config key '{prefix}{dotted}'.{hint}")
    hint_type = _field_types(type(obj))[head]
    current = getattr(obj, head)
    if dataclasses.is_dataclass(current):
        if rest:
            set_path(current, rest, value, prefix=full + ".")
        else:
            setattr(obj, head, from_dict(type(current), value, prefix=full + "."))
        return
    if rest:
        if isinstance(current, dict):  # free-form dicts (env.args) accept any nested key
            new = dict(current)
            _set_nested(new, rest, value)
            setattr(obj, head, new)
            return
        raise ConfigError(f"config key '{full}' is a {_type_name(hint_type)}, it has no field '{rest}'")
    setattr(obj, head, coerce(value, hint_type, full))


def coerce(value: Any, tp: Any, name: str) -> Any:
    """Check `value` against type `tp` (int, float, bool, str, Optional, Literal, list, dict)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, name)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{name}={value!r} is not a {_type_name(tp)}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            hint = did_you_mean(str(value), [str(a) for a in allowed])
            raise ConfigError(f"{name}={value!r} is not allowed; choose one of {choices}.{hint}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}={value!r} must be a list")
        (item_tp,) = typing.get_args(tp)[:1] or (Any,)
        return [coerce(v, item_tp, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}={value!r} must be a mapping")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}={value!r} must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{name}={value!r} must be an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads '1e-3' (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{name}={value!r} must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}={value!r} must be a string")
    raise AssertionError(f"config field {name} has an unsupported type {tp!r}")


def _set_nested(d: dict, dotted: str, value: Any) -> None:
    head, _, rest = dotted.partition(".")
    if rest:
        sub = dict(d.get(head) or {})
        _set_nested(sub, rest, value)
        d[head] = sub
    else:
        d[head] = value


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return {int: "integer", float: "number", bool: "boolean", str: "string",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key under `cls`, for suggestions."""
    keys = []
    for f in dataclasses.fields(cls):
        tp = _field_types(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            keys.extend(_all_keys(tp, prefix + f.name + "."))
        else:
            keys.append(prefix + f.name)
    return keys


def all_keys() -> list[str]:
    """Every valid dotted config key."""
    return _all_keys(Config)


# ---------------------------------------------------------------------------- validation
def validate(cfg: Config) -> None:
    """Reject impossible combinations before any work starts."""
    r, a, t = cfg.rollout, cfg.actor, cfg.trainer
    _positive(r, "rollout", "batch_size", "group_size", "max_new_tokens", "max_num_seqs")
    _positive(a, "actor", "ppo_epochs", "ppo_mini_batch_size", "micro_batch_size")
    _positive(t, "trainer", "total_steps", "eval_episodes", "max_checkpoints")
    _positive(cfg.env, "env", "max_turns")
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
    _positive(r, "rollout", "max_num_batched_tokens")
    for key in ("max_total_tokens", "max_model_len"):
        if getattr(r, key) is not None and getattr(r, key) < 2:
            raise ConfigError(f"rollout.{key}={getattr(r, key)} must be at least 2 tokens (or null for the default)")
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
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
                docs[node.target.id] = str(nxt.value.value)
    rows = []
    default = cls()
    for f in dataclasses.fields(cls):
        value = getattr(default, f.name)
        if dataclasses.is_dataclass(value):
            rows.extend(field_docs(type(value), prefix + f.name + "."))
        else:
            rows.append((prefix + f.name, repr(value), docs.get(f.name, "")))
    return rows
