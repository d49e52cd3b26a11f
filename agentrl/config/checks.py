"""Validation of a loaded Config: impossible values and combinations, each one line naming the
field and what would be accepted, before any work starts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.config.limits import check_limits
from agentrl.config.model import check_model_section
from agentrl.config.paths import check_config_paths
from agentrl.config.serve import validate_serve
from agentrl.config.runtime import check_runtime
from agentrl.errors import ConfigError, did_you_mean, shown

if TYPE_CHECKING:  # config.py calls validate; the types only are needed here
    from agentrl.config.schema import Config

def validate(cfg: Config) -> None:
    """Reject impossible combinations before any work starts."""
    r, a, t = cfg.rollout, cfg.actor, cfg.trainer
    check_limits(cfg)  # first: every number has its range, so every size below is bounded
    check_config_paths(cfg)
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
    if len(a.betas) != 2:
        raise ConfigError(f"actor.betas={a.betas} must be two numbers in [0, 1)")
    _validate_algorithm(cfg)
    check_model_section(cfg)
    _validate_env_groups(cfg)
    validate_serve(cfg)
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
        if cfg.rollout.batch_size % c.ppo_mini_batch_size or c.ppo_mini_batch_size % c.micro_batch_size:
            raise ConfigError(f"critic.ppo_mini_batch_size={c.ppo_mini_batch_size} must divide rollout.batch_size="
                              f"{cfg.rollout.batch_size} and be a multiple of critic.micro_batch_size="
                              f"{c.micro_batch_size}")
    if a.use_decoupled_loss and a.tis_imp_ratio_cap > 0:
        raise ConfigError("actor.use_decoupled_loss=true and actor.tis_imp_ratio_cap>0 both reweight by "
                          "pi_old / pi_behaviour; choose one")
    _validate_policy_loss(cfg)


# The modes agentrl.algos.policy_losses registers; named here so that a config error needs no torch.
BUILTIN_POLICY_LOSSES = ("cispo", "geo_mean", "gmpo", "gpg", "gspo", "sapo", "vanilla")


def _validate_policy_loss(cfg: Config) -> None:
    """actor.policy_loss: a known loss mode (user modes may come from `imports`), positive taus."""
    from agentrl.registry import POLICY_LOSSES

    p = cfg.actor.policy_loss
    known = sorted(set(BUILTIN_POLICY_LOSSES) | set(POLICY_LOSSES.names()))
    # A module in `imports` may register more modes: those are checked once it is imported.
    if not cfg.imports and p.loss_mode not in known:
        raise ConfigError(f"actor.policy_loss.loss_mode: unknown policy loss mode {shown(p.loss_mode)}."
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
        cfg.group_tags(split)  # raises on a count mismatch or an uneven split

