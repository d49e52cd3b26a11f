"""Each tag's env factory and agent, built and checked from the config before any work starts.

A run's env definitions are `cfg.env_definitions()`: the `custom_envs` sections, or the one
`env` section under its type's name. For every tag this module checks the env type and its
arguments (building one env, so a bad value or a dataset file without a `question` column
fails now, in one line), builds the agent that plays it (a seed-style agent is wrapped in
`SeedAgentAdapter`), and checks that the tokenizer's chat template is prefix-preserving for the
conversations those agents build.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.agents.compat import SeedAgentAdapter, is_seed_agent
from agentrl.agents.seed_data import SeedRow, load_rows
from agentrl.config import Config
from agentrl.envs.service import close_env
from agentrl.errors import AgentRLError, ConfigError, EnvError, RegistryError
from agentrl.llm.conversation import TokenBudget, check_chat_template
from agentrl.llm.engine import SamplingParams
from agentrl.registry import AGENTS, ENVS, import_file, load_builtins
from agentrl.rollout.collector import RolloutCollector, TagSpec


def import_user_modules(cfg: Config) -> None:
    """Import `cfg.imports` (module names or .py paths), once per process."""
    for name in cfg.imports:
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


def _env_factory(env_type: str, env_args: dict, section: str) -> Callable[[], Any]:
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
    args = dict(env_args)

    def factory():
        return cls(**args)

    # Bad argument values fail now, not inside the first episode; so does a close() that raises.
    try:
        env = factory()
    except ConfigError as e:  # the env's own argument checks name the argument
        raise ConfigError(e if str(e).startswith(section) else f"{section}.args: {e}") from None
    except AgentRLError:
        raise
    except Exception as e:
        raise ConfigError(f"{section}: env type '{env_type}' could not be built with args {args}: "
                          f"{type(e).__name__}: {_first_line(e)}") from None
    try:
        close_env(env)  # optional: seed-style envs have reset and step only
    except Exception as e:
        raise EnvError(f"{section}: env type '{env_type}': close() raised "
                       f"{type(e).__name__}: {_first_line(e)}") from None
    return factory


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def make_sampling(cfg: Config, tokenizer) -> SamplingParams:
    """Training-time sampling parameters from the rollout config."""
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop_token_ids=(tokenizer.eos_token_id,))


def make_budget(cfg: Config, model_context: int) -> TokenBudget:
    """The episode limits: rollout.max_episode_tokens, and the context (rollout.max_model_len or
    the model's own)."""
    context = cfg.rollout.max_model_len or model_context
    if context > model_context:
        raise ConfigError(f"rollout.max_model_len={context} exceeds the model's context of {model_context} "
                          "tokens (max_position_embeddings)")
    return TokenBudget(episode_tokens=cfg.rollout.max_episode_tokens, context=context)


def agent_class(cfg: Config, tag: str) -> tuple[type, str]:
    """The registered agent class that plays `tag`, and the config section that names it;
    its args are checked against its constructor (seed-style classes take theirs as they are)."""
    section = f"custom_envs.{tag}.agent" if cfg.env_definitions()[tag].agent is not None else "agent"
    agent_cfg = cfg.agent_for(tag)
    load_builtins()
    try:
        cls = AGENTS.get(agent_cfg.type)
    except RegistryError as e:
        raise ConfigError(f"{section}.type: {e}") from None
    params = inspect.signature(cls).parameters
    if not is_seed_agent(cls) and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in agent_cfg.args if k not in params]
        if unknown:
            raise ConfigError(f"{section}.args.{unknown[0]} is not an argument of agent type '{agent_cfg.type}'; "
                              f"accepted: {', '.join(params)}")
    return cls, section


def check_agents(cfg: Config) -> None:
    """Fail now on an unknown agent type or argument of any tag."""
    for tag in cfg.env_definitions():
        agent_class(cfg, tag)


def make_agent(cfg: Config, tag: str, tokenizer, budget: TokenBudget | None = None) -> Any:
    """The agent that plays `tag`: the env's own agent section, else the top-level one."""
    cls, section = agent_class(cfg, tag)
    definition, agent_cfg = cfg.env_definitions()[tag], cfg.agent_for(tag)
    sampling = make_sampling(cfg, tokenizer)
    if is_seed_agent(cls):
        return SeedAgentAdapter.from_class(cls, tokenizer, sampling, definition.max_turns, agent_cfg.system_prompt,
                                           budget, agent_cfg.args, section, seed_rows(cfg, tag),
                                           f"{where(cfg, tag)}.args.dataset_path")
    params = inspect.signature(cls).parameters
    kwargs = dict(tokenizer=tokenizer, sampling=sampling, max_turns=definition.max_turns,
                  system_prompt=agent_cfg.system_prompt)
    if budget is not None and ("budget" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())):
        kwargs["budget"] = budget  # agents written before budgets existed still work
    try:
        return cls(**kwargs, **agent_cfg.args)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{section}: {e}") from None


def make_tag_specs(cfg: Config, tokenizer, factories: dict[str, Callable[[], Any]],
                   budget: TokenBudget | None = None,
                   wrap: Callable[[Callable], Callable] = lambda f: f) -> dict[str, TagSpec]:
    """{tag: TagSpec(env factory, agent)} for the collector; `wrap` decorates each env factory."""
    return {tag: TagSpec(wrap(factories[tag]), make_agent(cfg, tag, tokenizer, budget)) for tag in factories}


def make_collector(cfg: Config, tokenizer, factories: dict[str, Callable[[], Any]], llm: Any,
                   budget: TokenBudget | None = None, vocab_size: int | None = None,
                   wrap: Callable[[Callable], Callable] = lambda f: f) -> RolloutCollector:
    """The collector of every tag's envs and agents against `llm`, guarded as the rollout section
    says (episode timeout, retries) and checking what agents return against `vocab_size`; the one
    place a run builds one (training, the warm start, Ray's env managers)."""
    return RolloutCollector(make_tag_specs(cfg, tokenizer, factories, budget, wrap), llm,
                            timeout=cfg.rollout.episode_timeout, max_retries=cfg.rollout.max_retries,
                            vocab_size=vocab_size)


def check_templates(cfg: Config, tokenizer) -> None:
    """Fail now if the chat template is not prefix-preserving for any agent's conversation."""
    for prompt in dict.fromkeys(cfg.agent_for(tag).system_prompt for tag in cfg.env_definitions()):
        check_chat_template(tokenizer, prompt)


def agent_texts(cfg: Config) -> list[str]:
    """Fixed text the run's agents write (system prompts, feedback), for the tiny tokenizer."""
    texts = []
    for tag in cfg.env_definitions():
        agent_cfg = cfg.agent_for(tag)
        if agent_cfg.system_prompt:
            texts.append(f"system\n{agent_cfg.system_prompt}")
        cls = AGENTS.get(agent_cfg.type) if agent_cfg.type in AGENTS else None
        if cls is not None and hasattr(cls, "corpus_texts"):
            texts.extend(f"user\n{t}" for t in cls.corpus_texts(agent_cfg.args))
    return texts


def seed_dataset(cfg: Config, tag: str) -> str | None:
    """The dataset of a seed-style tag: its env's `dataset_path` argument (as the seeds build
    their env), else that parameter's default in the env's constructor; None without one."""
    definition = cfg.env_definitions()[tag]
    path = definition.args.get("dataset_path")
    if path is None and definition.type in ENVS:
        param = _parameters(ENVS.get(definition.type)).get("dataset_path")
        if param is not None and isinstance(param.default, (str, Path)):
            path = param.default
    return str(path) if path else None


def seed_rows(cfg: Config, tag: str) -> tuple[SeedRow, ...]:
    """The prompts a seed-style agent of `tag` is fed when its env's reset gives no question."""
    path = seed_dataset(cfg, tag)
    return load_rows(path, f"{where(cfg, tag)}.args.dataset_path") if path else ()


def _parameters(cls: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return {}


def is_seed_tag(cfg: Config, tag: str) -> bool:
    """Whether `tag` is played by a seed-style agent (its env steps take (qid, answers))."""
    name = cfg.agent_for(tag).type
    return name in AGENTS and is_seed_agent(AGENTS.get(name))
