"""The run plan: everything the build derives from a config, computed and checked once.

`plan(cfg)` runs every model-free check (runtime/assembly/preflight.py) and records what the build steps
would otherwise each derive again: the env factory, env and agent of every tag, the seed rows a
seed-style agent is fed, the groups of a step and of an evaluation, the horizon, the budgets and
context limits, the model and its warm start, the algorithm, where generation runs, where the
parts run (the Ray placement, as far as it is known without a cluster). Every build step reads
the plan (runtime/assembly/plan_types.py), not the config. A run writes it beside config.yaml as
plan.json and logs `describe()` at its start; `agentrl plan` prints it and builds nothing.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from agentrl.algos.advantages import check_estimator, uses_greedy_baseline
from agentrl.algos.policy_losses import check_loss_mode
from agentrl.atomic import write_atomic
from agentrl.config import Config
from agentrl.config.runtime import placement_summary
from agentrl.models.embedded import cache_root, tiny_cache_key
from agentrl.runtime.assembly.engines import engine_key
from agentrl.runtime.assembly.placement import plan_placement
from agentrl.runtime.assembly.plan_types import PLAN_NAME, RunPlan, TagPlan
from agentrl.runtime.assembly.preflight import configured_context, preflight
from agentrl.tokenizer import Tokenizer

__all__ = ["PLAN_NAME", "RunPlan", "TagPlan", "plan", "save_plan"]


def plan(cfg: Config, tokenizer: Tokenizer | None = None) -> RunPlan:
    """Check `cfg` (every model-free check) and derive the plan of its run (`tokenizer`: one the
    caller gives instead of the model's own, which changes the warm start's cache)."""
    factories, tags, kind = preflight(cfg)  # engine.kind resolved once: the plan's kind answers from here on
    check_loss_mode(cfg.actor.policy_loss.loss_mode)  # after `imports`, which may register modes
    check_estimator(cfg.algorithm.adv_estimator)  # and estimators
    context, source = configured_context(cfg)
    r, rt = cfg.rollout, cfg.runtime
    reference = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward  # a KL term needs it: a copy and a forward
    attached = kind.attached(cfg.engine)  # generation on engine.urls: no engine replica to place
    placement = plan_placement(rt, reference, cfg.critic.enable, not attached) if rt.kind == "ray" else None
    horizon = float(r.max_new_tokens * cfg.max_turns())  # the constant of the *-token-sum-norm loss modes
    if r.max_episode_tokens:
        horizon = min(horizon, float(r.max_episode_tokens))
    section = copy.deepcopy  # the plan keeps its own copies: it does not change with `cfg`
    return RunPlan(
        run_dir=str(cfg.resolved_run_dir()), seed=cfg.seed, device=cfg.device, imports=tuple(cfg.imports),
        model=section(cfg.model), rollout=section(r), actor=section(cfg.actor), critic=section(cfg.critic),
        engine=section(cfg.engine), runtime=section(rt), trainer=section(cfg.trainer),
        estimator=cfg.algorithm.adv_estimator, tags=tags, factories=dict(factories),
        train_groups=tuple(cfg.group_tags("train")), val_groups=tuple(cfg.group_tags("val")),
        greedy_baselines=uses_greedy_baseline(cfg.algorithm.adv_estimator), max_turns=cfg.max_turns(),
        update_horizon=horizon, model_context=context, model_context_source=source, reference=reference,
        cache_dir=str(cache_root(cfg)),
        warm_start_cache=None if cfg.model.path else str(cache_root(cfg) / f"tiny-{tiny_cache_key(cfg, tokenizer)}"),
        engine_key=engine_key(cfg) if kind.served else None, placement=placement,
        placement_summary=(placement_summary(rt, kind.served, attached, kind.replicas_start)
                           if placement is not None else None))


def save_plan(run_plan: RunPlan, run_dir: Path) -> None:
    """Write run_dir/plan.json (beside config.yaml)."""
    write_atomic(Path(run_dir) / PLAN_NAME, json.dumps(run_plan.to_dict(), indent=2) + "\n")
