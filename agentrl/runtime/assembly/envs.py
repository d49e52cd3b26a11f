"""Each tag's env factory and agent, built and checked from the config before any work starts.

A run's env definitions are `cfg.env_definitions()`: the `custom_envs` sections, or the one
`env` section under its type's name. For every tag this module checks the env type and its
arguments (building one env, so a bad value or a dataset file without a `question` column
fails now, in one line) and records the tag's plan (`tag_plans`: its env, its agent's class and
arguments, a seed-style agent's rows); from the plan it builds the agent that plays the tag (a
seed-style agent is wrapped in `SeedAgentAdapter`) and the collector, and checks that the
tokenizer's chat template is prefix-preserving for the conversations those agents build.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from agentrl.agents.compat import SeedAgentAdapter, is_seed_agent
from agentrl.agents.seed_data import load_rows
from agentrl.config import Config, RolloutConfig
from agentrl.envs.service import close_env
from agentrl.errors import AgentRLError, ConfigError, EnvError, RegistryError
from agentrl.llm.conversation import TokenBudget, check_chat_template
from agentrl.llm.engine import SamplingParams
from agentrl.registry import AGENTS, ENVS, import_file, load_builtins
from agentrl.rollout.collector import RolloutCollector, TagSpec
from agentrl.runtime.assembly.plan_types import RunPlan, TagPlan
from agentrl.tokenizer import Tokenizer


def import_user_modules(imports: list[str] | tuple[str, ...]) -> None:
    """Import the user's modules (the config's `imports`: module names or .py paths), once per process."""
    for name in imports:
        try:
            if name.endswith(".py"):
                import_file(Path(name))
            else:
                importlib.import_module(name)
        except SystemExit as e:  # a module that exits would end the run with nothing said
            raise ConfigError(f"imports: module {name!r} called sys.exit({e.code!r}) while being imported; "
                              "a module listed in imports must only define and register things") from None
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(f"imports: could not import {name!r}: {type(e).__name__}: {first}") from None


def where(cfg: Config, tag: str) -> str:
    """The config section that defines `tag`, for error messages."""
    return f"custom_envs.{tag}" if cfg.custom_envs else "env"


def make_env_factories(cfg: Config) -> dict[str, Callable[[], Any]]:
    """{tag: zero-argument env constructor}; checks types and arguments by building one of each."""
    load_builtins()  # a caller that never started a run (a script, a benchmark) still finds the built-ins
    return {tag: _env_factory(definition.type, definition.args, where(cfg, tag))
            for tag, definition in cfg.env_definitions().items()}


def bind(run_plan: RunPlan) -> RunPlan:
    """`run_plan` with env factories of this process (one sent from another process has none):
    the registered classes, looked up after the user's modules are imported; not checked again
    (the plan's preflight built one env of each)."""
    if run_plan.factories:
        return run_plan
    load_builtins()
    return run_plan.with_factories({t.tag: _constructor(ENVS.get(t.env_type), dict(t.env_args))
                                    for t in run_plan.tags})


def _constructor(cls: Callable[..., Any], args: dict[str, Any]) -> Callable[[], Any]:
    def factory() -> Any:
        return cls(**args)

    return factory


def _env_factory(env_type: str, env_args: dict[str, Any], section: str) -> Callable[[], Any]:
    try:
        cls = ENVS.get(env_type)
    except RegistryError as e:
        raise ConfigError(f"{section}.type: {e}") from None
    params = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in env_args if k not in params]
        if unknown:
            raise ConfigError(f"{section}.args.{unknown[0]} is not an argument of env type '{env_type}'; "
                              f"accepted: {', '.join(params)}")
    factory = _constructor(cls, dict(env_args))
    # Bad argument values fail now, not inside the first episode; so does a close() that raises.
    try:
        env = factory()
    except ConfigError as e:  # the env's own argument checks name the argument
        raise ConfigError(e if str(e).startswith(section) else f"{section}.args: {e}") from None
    except AgentRLError:
        raise
    except Exception as e:
        raise ConfigError(f"{section}: env type '{env_type}' could not be built with args {env_args}: "
                          f"{type(e).__name__}: {_first_line(e)}") from None
    try:
        close_env(env)  # optional: seed-style envs have reset and step only
    except Exception as e:
        raise EnvError(f"{section}: env type '{env_type}': close() raised "
                       f"{type(e).__name__}: {_first_line(e)}") from None
    return factory


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def make_sampling(rollout: RolloutConfig, tokenizer: Tokenizer) -> SamplingParams:
    """Training-time sampling parameters from the rollout section."""
    r = rollout
    eos = tokenizer.eos_token_id  # None only for a tokenizer without one: then no stop id, not a None one
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop_token_ids=() if eos is None else (eos,))


def make_budget(run_plan: RunPlan, model_context: int) -> TokenBudget:
    """The episode limits: rollout.max_episode_tokens, and the context (rollout.max_model_len or
    the model's own)."""
    r = run_plan.rollout
    context = r.max_model_len or model_context
    if context > model_context:
        raise ConfigError(f"rollout.max_model_len={context} exceeds the model's context of {model_context} "
                          "tokens (max_position_embeddings)")
    return TokenBudget(episode_tokens=r.max_episode_tokens, context=context)


def tag_plans(cfg: Config) -> tuple[TagPlan, ...]:
    """The plan of every env tag of `cfg`: its agent's type and args are checked against the
    registered class (seed-style classes take theirs as they are), a seed-style agent's dataset
    is read."""
    load_builtins()
    return tuple(_tag_plan(cfg, tag) for tag in cfg.env_definitions())


def _tag_plan(cfg: Config, tag: str) -> TagPlan:
    definition, agent_cfg = cfg.env_definitions()[tag], cfg.agent_for(tag)
    section = f"custom_envs.{tag}.agent" if definition.agent is not None else "agent"
    try:
        cls = AGENTS.get(agent_cfg.type)
    except RegistryError as e:
        raise ConfigError(f"{section}.type: {e}") from None
    params = inspect.signature(cls).parameters
    if not is_seed_agent(cls) and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        if "budget" not in params:
            raise ConfigError(f"{section}.type: agent type '{agent_cfg.type}' ({cls.__qualname__}) cannot be built: "
                              "its constructor must accept `budget` (a TokenBudget, or None)")
        unknown = [k for k in agent_cfg.args if k not in params]
        if unknown:
            raise ConfigError(f"{section}.args.{unknown[0]} is not an argument of agent type '{agent_cfg.type}'; "
                              f"accepted: {', '.join(params)}")
    seed_style = is_seed_agent(cls)
    dataset = _seed_dataset(definition.type, definition.args) if seed_style else None
    rows = (load_rows(dataset, f"{where(cfg, tag)}.args.dataset_path") if dataset else ()) if seed_style else None
    return TagPlan(tag=tag, env_type=definition.type, env_args=dict(definition.args), max_turns=definition.max_turns,
                   env_section=where(cfg, tag), agent_type=agent_cfg.type,
                   agent_class=f"{cls.__module__}.{cls.__qualname__}", agent_args=dict(agent_cfg.args),
                   agent_section=section, system_prompt=agent_cfg.system_prompt, seed_dataset=dataset, rows=rows)


def make_agent(tag: TagPlan, rollout: RolloutConfig, tokenizer: Tokenizer, budget: TokenBudget | None = None) -> Any:
    """The agent that plays `tag` (sampling as the rollout section says)."""
    cls = AGENTS.get(tag.agent_type)
    sampling = make_sampling(rollout, tokenizer)
    if tag.rows is not None:  # tag.seed_style, spelled so that the rows are known to be there
        # from_class is annotated `type`; a registered seed-style agent is a class in practice
        return SeedAgentAdapter.from_class(cast(type, cls), tokenizer, sampling, tag.max_turns, tag.system_prompt,
                                           budget, tag.agent_args, tag.agent_section, tag.rows,
                                           f"{tag.env_section}.args.dataset_path")
    try:
        return cls(tokenizer=tokenizer, sampling=sampling, max_turns=tag.max_turns, system_prompt=tag.system_prompt,
                   budget=budget, **tag.agent_args)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{tag.agent_section}: {e}") from None


def make_collector(run_plan: RunPlan, tokenizer: Tokenizer, llm: Any, budget: TokenBudget | None = None,
                   vocab_size: int | None = None, factories: dict[str, Callable[[], Any]] | None = None,
                   wrap: Callable[[Callable], Callable] = lambda f: f) -> RolloutCollector:
    """The collector of every tag's envs (`factories`: those of the plan, or a subset) and agents
    against `llm`, guarded as the rollout section says (episode timeout, retries) and checking
    what agents return against `vocab_size`; the one place a run builds one (training, the warm
    start, Ray's env managers). `wrap` decorates each env factory."""
    factories = run_plan.factories if factories is None else factories
    r = run_plan.rollout
    specs = {t.tag: TagSpec(wrap(factories[t.tag]), make_agent(t, r, tokenizer, budget))
             for t in run_plan.tags if t.tag in factories}
    return RolloutCollector(specs, llm, timeout=r.episode_timeout, max_retries=r.max_retries, vocab_size=vocab_size)


def check_templates(run_plan: RunPlan, tokenizer: Tokenizer) -> None:
    """Fail now if the chat template is not prefix-preserving for any agent's conversation."""
    for prompt in dict.fromkeys(t.system_prompt for t in run_plan.tags):
        check_chat_template(tokenizer, prompt)


def agent_texts(run_plan: RunPlan) -> list[str]:
    """Fixed text the run's agents write (system prompts, feedback), for the tiny tokenizer."""
    texts = []
    for t in run_plan.tags:
        if t.system_prompt:
            texts.append(f"system\n{t.system_prompt}")
        cls = AGENTS.get(t.agent_type)
        if hasattr(cls, "corpus_texts"):
            texts.extend(f"user\n{line}" for line in cls.corpus_texts(t.agent_args))
    return texts


def _seed_dataset(env_type: str, env_args: dict[str, Any]) -> str | None:
    """The dataset of a seed-style tag: its env's `dataset_path` argument (as the seeds build
    their env), else that parameter's default in the env's constructor; None without one."""
    path = env_args.get("dataset_path")
    if path is None and env_type in ENVS:
        param = _parameters(ENVS.get(env_type)).get("dataset_path")
        if param is not None and isinstance(param.default, (str, Path)):
            path = param.default
    return str(path) if path else None


def _parameters(cls: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return {}
