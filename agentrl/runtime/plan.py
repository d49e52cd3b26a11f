"""The run plan: everything the build derives from a config, computed and checked once.

`plan(cfg)` runs every model-free check (runtime/build/preflight.py) and records what the build steps
would otherwise each derive again: the env factory, env and agent of every tag, the seed rows a
seed-style agent is fed, the groups of a step and of an evaluation, the horizon, the budgets and
context limits, the model and its warm start, the algorithm, where generation runs, where the
parts run (the Ray placement, as far as it is known without a cluster). A run writes it beside
config.yaml as plan.json and logs `describe()` at its start; `agentrl plan` prints it and builds
nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.algos.advantages import uses_greedy_baseline
from agentrl.algos.policy_losses import check_loss_mode
from agentrl.atomic import write_atomic
from agentrl.config import Config
from agentrl.config.runtime import placement_summary
from agentrl.models.embedded import cache_root, tiny_cache_key
from agentrl.runtime.build.envs import agent_class, is_seed_tag, seed_dataset, seed_rows
from agentrl.runtime.build.learners import needs_reference, update_horizon
from agentrl.runtime.build.preflight import configured_context, preflight
from agentrl.runtime.ray.placement import HEAD, Plan, plan_placement

PLAN_NAME = "plan.json"  # beside config.yaml in the run folder


@dataclass(frozen=True)
class TagPlan:
    """One env definition of the run: its env, the agent that plays it, the rows it is fed."""

    tag: str
    env_type: str
    env_args: dict[str, Any]
    max_turns: int
    agent_type: str
    agent_class: str  # module.qualname of the registered class
    agent_args: dict[str, Any]
    system_prompt: str | None
    seed_dataset: str | None  # a seed-style agent's dataset (its env's dataset_path); None otherwise
    seed_rows: int | None  # the rows of that dataset; None for an agent that is not seed-style


@dataclass(frozen=True)
class RunPlan:
    """What a run of one config is made of, derived once (callables are not part of `to_dict`)."""

    run_dir: str
    seed: int
    device: str
    tags: tuple[TagPlan, ...]
    factories: dict[str, Callable[[], Any]] = field(repr=False, compare=False)  # zero-argument env constructors
    group_size: int
    train_groups: tuple[str, ...]  # the tag of each group of a training step, in order
    val_groups: tuple[str, ...]  # the tag of each evaluation episode, in order
    greedy_baselines: bool  # each training group also plays a greedy episode (ReMax's baseline)
    max_staleness: int  # 0: on-policy; k: streamed, episodes at most k policy versions old
    stale_samples: str
    max_turns: int  # the most turns any env allows
    update_horizon: float  # the most tokens an episode generates
    max_new_tokens: int
    max_episode_tokens: int  # 0: no limit
    max_model_len: int  # 0: the model's context
    model_context: int | None  # None: model.path's config.json does not say
    model_context_source: str
    model_path: str | None  # None: the embedded tiny model
    dtype: str
    lora_rank: int
    warm_start: bool  # the embedded model is warm-started (unless cached)
    warm_start_steps: int
    warm_start_batch: int
    warm_start_cache: str | None  # the cache folder of this config's warm-started model
    estimator: str
    loss_mode: str
    reference: bool
    critic: bool
    total_steps: int
    test_freq: int
    save_freq: int
    imports: tuple[str, ...]  # the user's modules, imported before anything is checked
    engine_kind: str
    engine_urls: tuple[str, ...]
    engine_protocol: str
    runtime_kind: str
    num_threads: int
    placement: Plan | None  # runtime.kind=ray: workers and bundles (None: local)
    placement_summary: str | None

    @property
    def context(self) -> int | None:
        """The context limit of an episode: rollout.max_model_len, else the model's."""
        return self.max_model_len or self.model_context

    @property
    def groups_per_step(self) -> int:
        """Groups of a training step."""
        return len(self.train_groups)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON data (env factories and other callables left out)."""
        out = {
            "run_dir": self.run_dir, "seed": self.seed, "device": self.device,
            "model": {"path": self.model_path, "dtype": self.dtype, "lora_rank": self.lora_rank,
                      "context": self.model_context, "context_source": self.model_context_source},
            "warm_start": {"enabled": self.warm_start, "max_steps": self.warm_start_steps,
                           "batch_size": self.warm_start_batch, "cache": self.warm_start_cache},
            "tags": {t.tag: {k: v for k, v in asdict(t).items() if k != "tag"} for t in self.tags},
            "groups": {"group_size": self.group_size, "per_step": self.groups_per_step,
                       "episodes_per_step": self.groups_per_step * self.group_size,
                       "train": dict(Counter(self.train_groups)), "greedy_baselines": self.greedy_baselines,
                       "eval_episodes": len(self.val_groups), "eval": dict(Counter(self.val_groups))},
            "rollout": {"max_staleness": self.max_staleness, "stale_samples": self.stale_samples},
            "horizon": {"max_turns": self.max_turns, "update_tokens": self.update_horizon},
            "budgets": {"max_new_tokens": self.max_new_tokens, "max_episode_tokens": self.max_episode_tokens,
                        "max_model_len": self.max_model_len, "context": self.context},
            "algorithm": {"estimator": self.estimator, "loss_mode": self.loss_mode, "reference": self.reference,
                          "critic": self.critic},
            "schedule": {"total_steps": self.total_steps, "test_freq": self.test_freq, "save_freq": self.save_freq},
            "imports": list(self.imports),
            "engine": {"kind": self.engine_kind, "urls": list(self.engine_urls), "protocol": self.engine_protocol},
            "runtime": {"kind": self.runtime_kind, "num_threads": self.num_threads,
                        "placement": _placement_dict(self.placement, self.placement_summary)},
        }
        return json.loads(json.dumps(out, default=str))  # args a YAML file cannot hold become their text

    def describe(self) -> str:
        """The plan as lines for people (what `agentrl plan` prints and a run logs at its start)."""
        lines = [f"run plan of {self.run_dir} (seed {self.seed}; written there as {PLAN_NAME})"]
        add = lambda key, text: lines.append(f"  {key:<14} {text}")  # noqa: E731
        model = self.model_path or "the embedded tiny model"
        context = (f"{self.model_context} tokens ({self.model_context_source})" if self.model_context
                   else f"not given ({self.model_context_source})")
        add("model", f"{model}, {self.dtype}" + (f", LoRA rank {self.lora_rank}" if self.lora_rank else ""))
        add("", f"context {context}")
        add("warm start", f"on: at most {self.warm_start_steps} steps of {self.warm_start_batch} demonstrations, "
                          f"unless cached in {self.warm_start_cache}" if self.warm_start else "off (model.path)")
        add("env tags", ", ".join(t.tag for t in self.tags))
        for t in self.tags:
            add(f"  {t.tag}", f"env {t.env_type}, {_args(t.env_args)}; at most {t.max_turns} turns")
            add("", f"agent {t.agent_type} ({t.agent_class}), {_args(t.agent_args)}"
                    + ("; a system prompt" if t.system_prompt else ""))
            if t.seed_rows is not None:
                add("", f"seed-style: {t.seed_rows} rows of {t.seed_dataset or 'no dataset'}")
        greedy = " and a greedy baseline episode" if self.greedy_baselines else ""
        add("each step", f"{self.groups_per_step} groups of {self.group_size} episodes{greedy} "
                         f"({self.groups_per_step * self.group_size} trained): {_counts(self.train_groups)}")
        add("rollout", "on-policy (each step plays after the previous update)" if not self.max_staleness else
            f"streamed: episodes at most {self.max_staleness} policy version(s) old (older ones: {self.stale_samples})")
        add("evaluation", f"{len(self.val_groups)} greedy episodes: {_counts(self.val_groups)}")
        add("horizon", f"{self.max_turns} turns; at most {self.update_horizon:g} generated tokens an episode")
        limit = f"{self.max_episode_tokens} tokens an episode" if self.max_episode_tokens else "no episode limit"
        where = f"rollout.max_model_len={self.max_model_len}" if self.max_model_len else "the model's"
        add("budgets", f"{self.max_new_tokens} new tokens a reply, {limit}, context {self.context} ({where})")
        add("algorithm", f"{self.estimator}, loss mode {self.loss_mode}, "
                         f"{'a' if self.reference else 'no'} reference, {'a' if self.critic else 'no'} critic")
        add("schedule", f"{self.total_steps} steps, evaluate every {self.test_freq or '-'}, "
                        f"save every {self.save_freq or '-'} (and at the end)")
        add("engine", "local (a copy of the policy in the trainer's process)" if self.engine_kind == "local" else
            f"remote, {len(self.engine_urls)} server(s) ({self.engine_protocol}): {', '.join(self.engine_urls)}")
        add("runtime", f"{self.runtime_kind}, {self.num_threads} torch thread(s) a process, device {self.device}")
        if self.placement is not None:
            place = _placement_dict(self.placement, self.placement_summary)
            add("placement", self.placement_summary)
            add("", "workers " + _counts(tuple(w.role for w in self.placement.workers)))
            add("", f"needs {place['cpus']:g} CPUs and {place['gpus']} GPUs in {len(place['bundles'])} bundles "
                    "(checked against the cluster when it starts)")
        checks = [*(["imports"] if self.imports else []), "estimator", "loss mode", "context limits",
                  *(["LoRA targets"] if self.lora_rank else []), f"{len(self.tags)} env(s) built",
                  f"{len(self.tags)} agent(s) built", *(["engine servers answer"] if self.engine_urls else [])]
        add("checks", "passed: " + ", ".join(checks))
        return "\n".join(lines)


def _args(args: dict[str, Any]) -> str:
    return "args " + ", ".join(f"{k}={v!r}" for k, v in args.items()) if args else "no args"


def _counts(groups: tuple[str, ...]) -> str:
    return ", ".join(f"{tag} x{n}" for tag, n in Counter(groups).items())


def _placement_dict(placement: Plan | None, summary: str | None) -> dict[str, Any] | None:
    """Workers, bundles and what they need in all (the head-node marker left out)."""
    if placement is None:
        return None
    bundles = [{k: v for k, v in b.items() if k != HEAD} for b in placement.bundles]
    return {"summary": summary, "cpus": sum(b.get("CPU", 0.0) for b in bundles),
            "gpus": len({w.gpu for w in placement.workers if w.gpu is not None}),
            "bundles": bundles, "workers": [asdict(w) for w in placement.workers]}


def plan(cfg: Config, tokenizer: Any = None) -> RunPlan:
    """Check `cfg` (every model-free check) and derive the plan of its run (`tokenizer`: one the
    caller gives instead of the model's own, which changes the warm start's cache)."""
    factories = preflight(cfg)
    check_loss_mode(cfg.actor.policy_loss.loss_mode)  # after `imports`, which may register modes
    context, source = configured_context(cfg)
    r, m, rt, e = cfg.rollout, cfg.model, cfg.runtime, cfg.engine
    warm = m.path is None
    placement = plan_placement(cfg, needs_reference(cfg), cfg.critic.enable) if rt.kind == "ray" else None
    return RunPlan(
        run_dir=str(cfg.resolved_run_dir()), seed=cfg.seed, device=cfg.device,
        tags=tuple(_tag_plan(cfg, tag) for tag in cfg.env_definitions()), factories=dict(factories),
        group_size=r.group_size, train_groups=tuple(cfg.group_tags("train")), val_groups=tuple(cfg.group_tags("val")),
        greedy_baselines=uses_greedy_baseline(cfg.algorithm.adv_estimator), max_staleness=r.max_staleness,
        stale_samples=r.stale_samples,
        max_turns=cfg.max_turns(), update_horizon=update_horizon(cfg), max_new_tokens=r.max_new_tokens,
        max_episode_tokens=r.max_episode_tokens, max_model_len=r.max_model_len, model_context=context,
        model_context_source=source, model_path=m.path, dtype=m.dtype, lora_rank=m.lora.rank,
        warm_start=warm, warm_start_steps=m.warm_start.max_steps, warm_start_batch=m.warm_start.batch_size,
        warm_start_cache=str(cache_root(cfg) / f"tiny-{tiny_cache_key(cfg, tokenizer)}") if warm else None,
        estimator=cfg.algorithm.adv_estimator, loss_mode=cfg.actor.policy_loss.loss_mode,
        reference=needs_reference(cfg), critic=cfg.critic.enable, total_steps=cfg.trainer.total_steps,
        test_freq=cfg.trainer.test_freq, save_freq=cfg.trainer.save_freq, imports=tuple(cfg.imports),
        engine_kind=e.kind, engine_urls=tuple(e.urls), engine_protocol=e.protocol if e.kind == "remote" else "",
        runtime_kind=rt.kind, num_threads=rt.num_threads, placement=placement,
        placement_summary=placement_summary(rt) if placement is not None else None)


def _tag_plan(cfg: Config, tag: str) -> TagPlan:
    definition, agent = cfg.env_definitions()[tag], cfg.agent_for(tag)
    cls, _ = agent_class(cfg, tag)
    seed_style = is_seed_tag(cfg, tag)
    return TagPlan(tag=tag, env_type=definition.type, env_args=dict(definition.args), max_turns=definition.max_turns,
                   agent_type=agent.type, agent_class=f"{cls.__module__}.{cls.__qualname__}",
                   agent_args=dict(agent.args), system_prompt=agent.system_prompt,
                   seed_dataset=seed_dataset(cfg, tag) if seed_style else None,
                   seed_rows=len(seed_rows(cfg, tag)) if seed_style else None)


def save_plan(run_plan: RunPlan, run_dir: Path) -> None:
    """Write run_dir/plan.json (beside config.yaml)."""
    write_atomic(Path(run_dir) / PLAN_NAME, json.dumps(run_plan.to_dict(), indent=2) + "\n")
