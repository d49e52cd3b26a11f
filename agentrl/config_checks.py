"""Validation of a loaded Config: impossible values and combinations, each one line naming the
field and what would be accepted, before any work starts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config_limits import check_limits
from agentrl.config_model import check_model_section
from agentrl.config_serve import validate_serve
from agentrl.config_runtime import check_runtime
from agentrl.errors import ConfigError, did_you_mean

if TYPE_CHECKING:  # config.py calls validate; the types only are needed here
    from agentrl.config import Config

def validate(cfg: Config) -> None:
    """Reject impossible combinations before any work starts."""
    r, a, t = cfg.rollout, cfg.actor, cfg.trainer
    check_limits(cfg)  # first: every size below is bounded before anything is built from it
    _positive(r, "rollout", "batch_size", "group_size", "max_new_tokens")
    _positive(cfg.engine, "engine", "max_num_seqs", "max_num_batched_tokens")
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
    e = cfg.engine
    if e.max_total_tokens is not None and e.max_total_tokens < 2:
        raise ConfigError(f"engine.max_total_tokens={e.max_total_tokens} must be at least 2 tokens (or null for the default)")
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
    check_model_section(cfg)
    _validate_env_groups(cfg)
    validate_serve(cfg)
    if t.test_freq < 0 or t.save_freq < 0 or t.dump_trajectories_freq < 0:
        raise ConfigError("trainer.test_freq, trainer.save_freq and trainer.dump_trajectories_freq must be >= 0")
    _positive(t, "trainer", "dump_max_tokens")
    cfg.health.check()
    if "wandb" in t.logger:
        from agentrl.wandb_sink import check_installed

        check_installed()
    check_runtime(cfg)
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
    if cfg.custom_envs and cfg.env != type(cfg.env)():
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
