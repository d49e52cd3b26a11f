"""The trainer of a run, built from its plan (runtime/assembly/plan.py) in three pieces, always in this order (the steps
that draw random numbers give the same parts for the same config and seed): the policy (model
and tokenizer, after every model-free check: policy.py), the rollout side (engine, agents,
collector, task source, rollout source: rollout.py) and the learning side (actor, reference,
critic: learners.py). Where they run is the caller's business: runtime/local.py runs all of
them in this process; the Ray runtime (runtime/ray/) places them as actors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl.config import Config
from agentrl.rollout.source import RolloutSource
from agentrl.runtime.assembly.learners import build_learners
from agentrl.runtime.assembly.plan import RunPlan, plan
from agentrl.runtime.assembly.policy import build_policy
from agentrl.runtime.assembly.rollout import build_rollout, eval_baselines
from agentrl.runtime.process import resolve_device, seed_everything
from agentrl.tokenizer import Tokenizer
from agentrl.train.actor import Actor, Reference
from agentrl.train.critic import Critic
from agentrl.train.trainer import Trainer


@dataclass
class RunParts:
    """Everything a trainer is made of, built from one config."""

    tokenizer: Tokenizer
    rollout: RolloutSource  # plays the episodes (holds the engine, collector and task source)
    actor: Actor
    reference: Reference | None
    critic: Critic | None
    eval_baselines: dict[str, Callable]


def build_trainer(cfg: Config, run_dir: Path, log: Callable[[str], None] = print, tokenizer: Tokenizer | None = None,
                  run_plan: RunPlan | None = None) -> Trainer:
    """The trainer of `cfg`, with every part built here from its plan (`run_plan`: the plan of
    `cfg` the caller already made; `tokenizer`: one instead of the model's own). The trainer
    itself reads `cfg` (its schedule, the algorithm) as it runs."""
    parts = build_parts(run_plan or plan(cfg, tokenizer), log, tokenizer)
    trainer = Trainer(cfg, parts.actor, parts.rollout, parts.tokenizer, run_dir, eval_baselines=parts.eval_baselines,
                      reference=parts.reference, critic=parts.critic)
    trainer.log = log
    return trainer


def build_parts(run_plan: RunPlan, log: Callable[[str], None] = print, tokenizer: Tokenizer | None = None) -> RunParts:
    """The policy, the rollout side and the learning side of the run planned as `run_plan`.

    The order of the steps that draw random numbers is fixed: the same config and seed give
    the same parts."""
    seed_everything(run_plan.seed)
    device = resolve_device(run_plan.device)
    model, tokenizer = build_policy(run_plan, log, tokenizer)
    model.to(device)
    seed_everything(run_plan.seed)
    rollout = build_rollout(run_plan, model, tokenizer, device)
    try:
        actor, reference, critic = build_learners(run_plan, model, device)
    except BaseException:
        rollout.shutdown()  # servers the engine started stop with the failed build
        raise
    return RunParts(tokenizer, rollout, actor, reference, critic, eval_baselines(run_plan.factories))
