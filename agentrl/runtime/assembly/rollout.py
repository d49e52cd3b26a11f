"""The rollout side of a run: the engine (a copy of the policy in this process, or the servers of
engine.urls), the agents and envs of every tag, the task source and the rollout source that plays
them; and the envs' own evaluation baselines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agentrl.envs.service import close_env
from agentrl.rollout.curriculum import Curriculum
from agentrl.rollout.source import RolloutSource, rollout_source
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.assembly.engines import make_engine
from agentrl.runtime.assembly.envs import make_budget, make_collector
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.assembly.policy import model_context, model_vocab
from agentrl.tokenizer import Tokenizer


def build_rollout(run_plan: RunPlan, model: Any, tokenizer: Tokenizer, device: torch.device) -> RolloutSource:
    """The engine (a copy of `model`, or the servers of engine.urls), the agents and envs of every
    tag, and the rollout source that plays them; a runtime that places the engine elsewhere
    replaces this."""
    engine = make_engine(run_plan, model, tokenizer, device)  # in this process, or the servers of engine.urls
    budget = make_budget(run_plan, model_context(model))
    collector = make_collector(run_plan, tokenizer, engine, budget, model_vocab(model))
    return rollout_source(collector, engine, task_source(run_plan), run_plan.max_staleness,
                          accept_stale=run_plan.rollout.stale_samples == "correct")


def task_source(run_plan: RunPlan) -> TaskSource:
    """The groups of each training step and evaluation, drawn from the run's seed (and, with
    rollout.curriculum.enable, from the curriculum's estimates)."""
    c = run_plan.rollout.curriculum
    curriculum = (Curriculum.from_config(c, run_plan.seed, run_plan.group_size, run_plan.train_groups)
                  if c.enable else None)
    return TaskSource(run_plan.seed, run_plan.group_size, run_plan.train_groups, run_plan.val_groups,
                      greedy_baselines=run_plan.greedy_baselines, curriculum=curriculum)


def eval_baselines(factories: dict[str, Callable]) -> dict[str, Callable]:
    """{tag: env.eval_baselines} for the envs that offer reference policies."""
    out = {}
    for tag, make_env in factories.items():
        env = make_env()
        if callable(getattr(env, "eval_baselines", None)):
            out[tag] = env.eval_baselines
        close_env(env)
    return out
