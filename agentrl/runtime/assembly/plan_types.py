"""The run plan's records: `RunPlan` (a run, as every build step reads it), `TagPlan` (one env
definition: its env, the agent that plays it, the rows it is fed) and `EngineKind` (what the run
does for its engine.kind). Made by `plan(cfg)` (runtime/assembly/plan.py); written as plan.json
and described for people here."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agentrl.agents.seed_data import SeedRow
from agentrl.config import (
    ActorConfig,
    Config,
    CriticConfig,
    EngineConfig,
    ModelConfig,
    RolloutConfig,
    RuntimeConfig,
    TrainerConfig,
)
from agentrl.registry import ENGINE_KINDS
from agentrl.runtime.assembly.placement import HEAD, Plan

if TYPE_CHECKING:  # the engine's types, for the hints of EngineKind.make only
    import torch

    from agentrl.llm.engine import InferenceEngine
    from agentrl.tokenizer import Tokenizer

PLAN_NAME = "plan.json"  # beside config.yaml in the run folder


class EngineKind:
    """What a run does for one engine.kind: its model-free checks, how its engine is made from the
    plan, how the plan describes it, and how a Ray run places it. One subclass per kind, one file
    each (runtime/assembly/engine_kinds/), registered by name in `agentrl.registry.ENGINE_KINDS`
    (a user's module in `imports` registers more); the plan resolves engine.kind once."""

    served: bool = False
    """Generation runs on inference servers over HTTP, not on an engine the run builds from the
    policy: a Ray run's env managers reach them as clients (runtime/ray/served.py) and trainer
    rank 0 pushes the weights; elastic scaling and runtime.weight_sync do not apply."""
    ray_replica: str = "engine"
    """What a Ray run starts as each runtime.actor_infer replica: `engine` (an in-process engine
    built from the plan, runtime/ray/engine_actor.py) or `vllm` (a vLLM server,
    runtime/ray/vllm_replica.py)."""
    replicas_start: str = ""
    """What each Ray engine replica starts besides itself, for the placement line ("" for nothing)."""
    server_versions: bool = False
    """The servers label generated ids with the policy versions the run pushed (a Ray env
    manager's client then reads them instead of stamping its own)."""

    def attached(self, e: EngineConfig) -> bool:
        """Whether generation runs on the given servers of engine.urls, so that a Ray run places
        no engine replica of its own."""
        return False

    def check(self, cfg: Config) -> None:
        """The kind's checks that need more than the config (its servers answer, its interpreter
        exists), run in the preflight before any model is built; one line each."""

    def make(self, run_plan: RunPlan, model: Any, tokenizer: Tokenizer, device: torch.device) -> InferenceEngine:
        """The run's engine, serving `model`'s weights as policy version 0."""
        raise NotImplementedError(f"{type(self).__name__} does not make an engine")

    def wire_protocol(self, e: EngineConfig) -> str:
        """The wire format of the servers (a served kind's clients speak it)."""
        return e.protocol

    def weights_route(self, e: EngineConfig) -> str:
        """How new weights reach a served kind's servers, for a Ray run's start-up line."""
        return f"HTTP to engine.urls ({'engine.weights_dir' if e.weights_dir else 'request body'})"

    def to_dict(self, run_plan: RunPlan) -> dict[str, Any]:
        """plan.json's engine section."""
        e = run_plan.engine
        return {"kind": e.kind, "urls": list(e.urls), "protocol": ""}

    def describe(self, run_plan: RunPlan) -> list[tuple[str, str]]:
        """The plan's engine lines for people, as (key, text) pairs."""
        return [("engine", run_plan.engine.kind)]

    def checks(self, run_plan: RunPlan) -> list[str]:
        """The names of the kind's own preflight checks, for the plan's list of checks passed."""
        return []


@dataclass(frozen=True)
class TagPlan:
    """One env definition of the run: its env, the agent that plays it, the rows it is fed."""

    tag: str
    env_type: str
    env_args: dict[str, Any]
    max_turns: int
    env_section: str  # the config section that defines it (custom_envs.<tag> or env), for error messages
    agent_type: str
    agent_class: str  # module.qualname of the registered class
    agent_args: dict[str, Any]
    agent_section: str  # the config section of its agent (custom_envs.<tag>.agent or agent)
    system_prompt: str | None
    seed_dataset: str | None  # a seed-style agent's dataset (its env's dataset_path); None otherwise
    rows: tuple[SeedRow, ...] | None = field(repr=False)  # that dataset's rows; None: not a seed-style agent

    @property
    def seed_style(self) -> bool:
        """Played by a seed-style agent (its env steps take (qid, answers))."""
        return self.rows is not None

    def to_dict(self) -> dict[str, Any]:
        """The tag as plain data (the dataset's rows counted, not listed)."""
        return {"env_type": self.env_type, "env_args": self.env_args, "max_turns": self.max_turns,
                "agent_type": self.agent_type, "agent_class": self.agent_class, "agent_args": self.agent_args,
                "system_prompt": self.system_prompt, "seed_dataset": self.seed_dataset,
                "seed_rows": None if self.rows is None else len(self.rows)}


@dataclass(frozen=True)
class RunPlan:
    """What a run of one config is made of, derived once: the config sections the build steps
    read (copies: the plan does not change with the config it came from) and what they would
    otherwise each derive again (callables and the engine key are not part of `to_dict`)."""

    run_dir: str
    seed: int
    device: str
    imports: tuple[str, ...]  # the user's modules, imported before anything is checked
    # The sections the build steps read as they are.
    model: ModelConfig = field(repr=False)
    rollout: RolloutConfig = field(repr=False)
    actor: ActorConfig = field(repr=False)
    critic: CriticConfig = field(repr=False)
    engine: EngineConfig = field(repr=False)
    runtime: RuntimeConfig = field(repr=False)
    trainer: TrainerConfig = field(repr=False)
    estimator: str  # algorithm.adv_estimator
    # What the build derives from them.
    tags: tuple[TagPlan, ...]  # every env definition, in the config's order
    factories: dict[str, Callable[[], Any]] = field(repr=False, compare=False)  # zero-argument env constructors
    train_groups: tuple[str, ...]  # the tag of each group of a training step, in order
    val_groups: tuple[str, ...]  # the tag of each evaluation episode, in order
    greedy_baselines: bool  # each training group also plays a greedy episode (ReMax's baseline)
    max_turns: int  # the most turns any env allows
    update_horizon: float  # the most tokens an episode generates
    model_context: int | None  # None: model.path's config.json does not say
    model_context_source: str
    reference: bool  # a KL term needs the frozen reference policy
    cache_dir: str  # model.cache_dir, $AGENTRL_CACHE or ~/.cache/agentrl
    warm_start_cache: str | None  # the cache folder of this config's warm-started model (None: model.path)
    engine_key: str | None = field(repr=False)  # the key of the servers of engine.urls (never written out)
    placement: Plan | None  # runtime.kind=ray: workers and bundles (None: local)
    placement_summary: str | None

    @property
    def group_size(self) -> int:
        """Episodes of a group."""
        return self.rollout.group_size

    @property
    def max_staleness(self) -> int:
        """0: on-policy; k: streamed, episodes at most k policy versions old."""
        return self.rollout.max_staleness

    @property
    def warm_start(self) -> bool:
        """The embedded model is warm-started (unless cached)."""
        return self.warm_start_cache is not None

    def tag(self, name: str) -> TagPlan:
        """The plan of env tag `name`."""
        return next(t for t in self.tags if t.tag == name)

    def portable(self) -> RunPlan:
        """This plan without its env factories, to send to another process (which binds its own)."""
        return replace(self, factories={})

    def with_factories(self, factories: dict[str, Callable[[], Any]]) -> RunPlan:
        """This plan with the env factories of another process (runtime/assembly/envs.py: `bind`)."""
        return replace(self, factories=factories)

    @property
    def context(self) -> int | None:
        """The context limit of an episode: rollout.max_model_len, else the model's."""
        return self.rollout.max_model_len or self.model_context

    @property
    def groups_per_step(self) -> int:
        """Groups of a training step."""
        return len(self.train_groups)

    @property
    def engine_kind(self) -> EngineKind:
        """engine.kind's object (runtime/assembly/engine_kinds/): every question about the kind
        goes to it. Looked up by the name `plan(cfg)` checked, so that a plan sent to a Ray actor
        finds a user's kind once the actor has imported the user's modules."""
        kind: EngineKind = ENGINE_KINDS.get(self.engine.kind)()
        return kind

    @property
    def vllm_pause_mode(self) -> str:
        """How vLLM servers pause for a weight push (engine.kind=vllm): on-policy nothing is in
        flight (`wait`); streamed, replies in flight continue under the new weights (`keep`)."""
        return "keep" if self.max_staleness else "wait"

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON data (env factories and other callables left out)."""
        m, r = self.model, self.rollout
        out = {
            "run_dir": self.run_dir, "seed": self.seed, "device": self.device,
            "model": {"path": m.path, "dtype": m.dtype, "lora_rank": m.lora.rank,
                      "context": self.model_context, "context_source": self.model_context_source},
            "warm_start": {"enabled": self.warm_start, "max_steps": m.warm_start.max_steps,
                           "batch_size": m.warm_start.batch_size, "cache": self.warm_start_cache},
            "tags": {t.tag: t.to_dict() for t in self.tags},
            "groups": {"group_size": self.group_size, "per_step": self.groups_per_step,
                       "episodes_per_step": self.groups_per_step * self.group_size,
                       "train": dict(Counter(self.train_groups)), "greedy_baselines": self.greedy_baselines,
                       "eval_episodes": len(self.val_groups), "eval": dict(Counter(self.val_groups))},
            "rollout": {"max_staleness": r.max_staleness, "stale_samples": r.stale_samples,
                        **({"curriculum": asdict(r.curriculum)} if r.curriculum.enable else {})},
            "horizon": {"max_turns": self.max_turns, "update_tokens": self.update_horizon},
            "budgets": {"max_new_tokens": r.max_new_tokens, "max_episode_tokens": r.max_episode_tokens,
                        "max_model_len": r.max_model_len, "context": self.context},
            "algorithm": {"estimator": self.estimator, "loss_mode": self.actor.policy_loss.loss_mode,
                          "reference": self.reference, "critic": self.critic.enable},
            "schedule": {"total_steps": self.trainer.total_steps, "test_freq": self.trainer.test_freq,
                         "save_freq": self.trainer.save_freq},
            "imports": list(self.imports),
            "engine": self.engine_kind.to_dict(self),
            "runtime": {"kind": self.runtime.kind, "num_threads": self.runtime.num_threads,
                        "placement": None if self.placement is None
                        else _placement_dict(self.placement, self.placement_summary)},
        }
        return json.loads(json.dumps(out, default=str))  # args a YAML file cannot hold become their text

    def describe(self) -> str:
        """The plan as lines for people (what `agentrl plan` prints and a run logs at its start)."""
        m, r, e, s = self.model, self.rollout, self.engine, self.trainer
        lines = [f"run plan of {self.run_dir} (seed {self.seed}; written there as {PLAN_NAME})"]
        add = lambda key, text: lines.append(f"  {key:<14} {text}")  # noqa: E731
        model = m.path or "the embedded tiny model"
        context = (f"{self.model_context} tokens ({self.model_context_source})" if self.model_context
                   else f"not given ({self.model_context_source})")
        add("model", f"{model}, {m.dtype}" + (f", LoRA rank {m.lora.rank}" if m.lora.rank else ""))
        add("", f"context {context}")
        add("warm start", f"on: at most {m.warm_start.max_steps} steps of {m.warm_start.batch_size} demonstrations, "
                          f"unless cached in {self.warm_start_cache}" if self.warm_start else "off (model.path)")
        add("env tags", ", ".join(t.tag for t in self.tags))
        for t in self.tags:
            add(f"  {t.tag}", f"env {t.env_type}, {_args(t.env_args)}; at most {t.max_turns} turns")
            add("", f"agent {t.agent_type} ({t.agent_class}), {_args(t.agent_args)}"
                    + ("; a system prompt" if t.system_prompt else ""))
            if t.seed_style:
                add("", f"seed-style: {len(t.rows or ())} rows of {t.seed_dataset or 'no dataset'}")
        greedy = " and a greedy baseline episode" if self.greedy_baselines else ""
        add("each step", f"{self.groups_per_step} groups of {self.group_size} episodes{greedy} "
                         f"({self.groups_per_step * self.group_size} trained): {_counts(self.train_groups)}")
        add("rollout", "on-policy (each step plays after the previous update)" if not r.max_staleness else
            f"streamed: episodes at most {r.max_staleness} policy version(s) old (older ones: {r.stale_samples})")
        c = r.curriculum
        if c.enable:
            add("curriculum", f"tasks from a pool of {c.pool_size} per tag, {c.uniform_ratio:g} of groups drawn "
                              f"uniformly, the others by rule {c.rule} (estimates: EMA {c.ema:g})")
        add("evaluation", f"{len(self.val_groups)} greedy episodes: {_counts(self.val_groups)}")
        add("horizon", f"{self.max_turns} turns; at most {self.update_horizon:g} generated tokens an episode")
        limit = f"{r.max_episode_tokens} tokens an episode" if r.max_episode_tokens else "no episode limit"
        where = f"rollout.max_model_len={r.max_model_len}" if r.max_model_len else "the model's"
        add("budgets", f"{r.max_new_tokens} new tokens a reply, {limit}, context {self.context} ({where})")
        add("algorithm", f"{self.estimator}, loss mode {self.actor.policy_loss.loss_mode}, "
                         f"{'a' if self.reference else 'no'} reference, {'a' if self.critic.enable else 'no'} critic")
        add("schedule", f"{s.total_steps} steps, evaluate every {s.test_freq or '-'}, "
                        f"save every {s.save_freq or '-'} (and at the end)")
        kind = self.engine_kind
        for key, text in kind.describe(self):
            add(key, text)
        add("runtime", f"{self.runtime.kind}, {self.runtime.num_threads} torch thread(s) a process, "
                       f"device {self.device}")
        if self.placement is not None:
            place = _placement_dict(self.placement, self.placement_summary)
            add("placement", self.placement_summary)
            add("", "workers " + _counts(tuple(w.role for w in self.placement.workers)))
            add("", f"needs {place['cpus']:g} CPUs and {place['gpus']} GPUs in {len(place['bundles'])} bundles "
                    "(checked against the cluster when it starts)")
        checks = [*(["imports"] if self.imports else []), "estimator", "loss mode", "context limits",
                  *(["LoRA targets"] if m.lora.rank else []), f"{len(self.tags)} env(s) built",
                  f"{len(self.tags)} agent(s) built", *(["engine servers answer"] if e.urls else []),
                  *kind.checks(self)]
        add("checks", "passed: " + ", ".join(checks))
        return "\n".join(lines)


def _args(args: dict[str, Any]) -> str:
    return "args " + ", ".join(f"{k}={v!r}" for k, v in args.items()) if args else "no args"


def _counts(groups: tuple[str, ...]) -> str:
    return ", ".join(f"{tag} x{n}" for tag, n in Counter(groups).items())


def _placement_dict(placement: Plan, summary: str | None) -> dict[str, Any]:
    """Workers, bundles and what they need in all (the head-node marker left out)."""
    bundles = [{k: v for k, v in b.items() if k != HEAD} for b in placement.bundles]
    return {"summary": summary, "cpus": sum(b.get("CPU", 0.0) for b in bundles),
            "gpus": len({w.gpu for w in placement.workers if w.gpu is not None}),
            "bundles": bundles, "workers": [asdict(w) for w in placement.workers]}


