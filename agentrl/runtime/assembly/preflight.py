"""Every check of a run that needs no model, run before the model is built or warm-started.

A warm start takes minutes on a fresh machine; a mistake that the config alone reveals must
not wait for it. `preflight(cfg)` checks, in one line each: the advantage estimator, the curriculum rule, the user
modules, every env type and its arguments (building and closing one env of each tag), every
agent type and its arguments (building each agent with a stand-in tokenizer), the context
limits (rollout.max_model_len against the model's context, read from model.tiny or from
model.path's config.json, and rollout.max_new_tokens against both), where generation runs
(engine.kind's own checks: every server URL answers, vLLM's interpreter; an OpenAI-client
agent's entry imports), and LoRA's target
modules (against a weightless skeleton of the model on the meta device).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from agentrl.agents.game import is_game
from agentrl.config import Config
from agentrl.errors import ConfigError, RegistryError, shown
from agentrl.registry import AGENTS, CURRICULUM_RULES, ESTIMATORS, load_builtins
from agentrl.runtime.assembly.engine_kinds import engine_kind
from agentrl.runtime.assembly.engines import check_serving
from agentrl.runtime.assembly.envs import import_user_modules, make_agent, make_env_factories, tag_plans
from agentrl.runtime.assembly.plan_types import EngineKind, TagPlan
from agentrl.tokenizer import Tokenizer
from agentrl.tools.tool import check_only


def preflight(cfg: Config) -> tuple[dict[str, Callable[[], Any]], tuple[TagPlan, ...], EngineKind]:
    """Run every model-free check of `cfg`; returns the env factories, the plan of every tag and
    the object of engine.kind."""
    load_builtins()
    import_user_modules(cfg.imports)  # first: a user's file may register the estimator, loss or engine kind named below
    kind = engine_kind(cfg.engine.kind)
    check_estimator(cfg)
    check_curriculum_rule(cfg)
    check_context(cfg)
    check_lora(cfg)
    factories = make_env_factories(cfg)
    tags = tag_plans(cfg)  # agent types and argument names
    check_agent_args(cfg, tags)
    check_games(factories, tags)
    check_serving(cfg, kind)  # the engine kind's checks (servers answer), OpenAI-client agents' entries import
    return factories, tags, kind


def check_games(factories: dict[str, Callable[[], Any]], tags: tuple[TagPlan, ...]) -> None:
    """A game (an env with two or more roles) only with an agent that plays one seat per role (agents/game.py)."""
    for tag in tags:
        if getattr(AGENTS.get(tag.agent_type), "plays_games", False) or tag.seed_style:
            continue
        env = factories[tag.tag]()
        try:
            if is_game(env):
                raise ConfigError(f"{tag.agent_section}.type={shown(tag.agent_type)} does not play games: env "
                                  f"{shown(tag.env_type)} is one of roles {', '.join(env.roles)}; "
                                  "use agent.type=chat or tool (one conversation per role)")
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                close()


def check_estimator(cfg: Config) -> None:
    """algorithm.adv_estimator must name a registered estimator."""
    try:
        ESTIMATORS.get(cfg.algorithm.adv_estimator)
    except RegistryError as e:
        raise ConfigError(f"algorithm.adv_estimator: {e}") from None


def check_curriculum_rule(cfg: Config) -> None:
    """rollout.curriculum.rule must name a registered rule (a user's module may register one)."""
    import agentrl.rollout.curriculum  # noqa: F401 (registers the built-in rules)

    try:
        CURRICULUM_RULES.get(cfg.rollout.curriculum.rule)
    except RegistryError as e:
        raise ConfigError(f"rollout.curriculum.rule: {e}") from None


def configured_context(cfg: Config) -> tuple[int | None, str]:
    """The model's context length as the config gives it (without building the model), and where
    it comes from; None when model.path's config.json does not say."""
    if not cfg.model.path:
        return cfg.model.tiny.max_position_embeddings, "model.tiny.max_position_embeddings"
    path = Path(cfg.model.path).expanduser() / "config.json"
    try:
        value = json.loads(path.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None, str(path)
    return (value if isinstance(value, int) and value > 0 else None), f"max_position_embeddings in {path}"


def check_context(cfg: Config) -> None:
    """rollout.max_model_len fits the model, and leaves room for a prompt besides a reply."""
    r = cfg.rollout
    model_context, source = configured_context(cfg)
    if r.max_model_len and model_context is not None and r.max_model_len > model_context:
        raise ConfigError(f"rollout.max_model_len={r.max_model_len} exceeds the model's context of "
                          f"{model_context} tokens ({source}); use at most {model_context} (or 0 for the model's)")
    context = r.max_model_len or model_context
    if context is not None and r.max_new_tokens >= context:
        what = f"rollout.max_model_len={r.max_model_len}" if r.max_model_len else f"the model's context ({source})"
        raise ConfigError(f"rollout.max_new_tokens={r.max_new_tokens} leaves no room for a prompt in {what} of "
                          f"{context} tokens; lower rollout.max_new_tokens or raise the context")


def check_lora(cfg: Config) -> None:
    """With model.lora.rank > 0: peft is installed and every target module name matches a
    linear layer of the model (read from a skeleton on the meta device: no weights built)."""
    if not cfg.model.lora.enabled:
        return
    from agentrl.models.lora import check_targets, require_peft, skeleton

    require_peft()
    if cfg.model.path:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(Path(cfg.model.path).expanduser())
        except (OSError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"could not read the config of model.path={cfg.model.path!r}: {first}") from None
    else:
        from agentrl.models.tiny import tiny_config

        config = tiny_config(cfg.model.tiny, cfg.model.tiny.vocab_size)
    check_targets(skeleton(config), cfg.model.lora.target_modules)


class StandInTokenizer:
    """What agent constructors read of a tokenizer, before the real one exists (it is built with
    the model): its special ids, and `name_or_path`, a folder that `AutoTokenizer.from_pretrained`
    loads (a small tokenizer, saved there when first asked for), so that a seed agent's
    `tokenizer_path` names a real folder, never a Hub repository."""

    eos_token_id = 0
    pad_token_id = 0

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @property
    def name_or_path(self) -> str:
        """The stand-in's tokenizer folder (written on first use)."""
        if not (self.folder / "tokenizer_config.json").is_file():
            from agentrl.models.tiny import build_tokenizer

            build_tokenizer(["a stand-in tokenizer"], vocab_size=300).save_pretrained(self.folder)
        return str(self.folder)


def check_agent_args(cfg: Config, tags: tuple[TagPlan, ...]) -> None:
    """Build each tag's agent with a stand-in tokenizer; a constructor that rejects its args
    (TypeError / ValueError) fails now, naming the argument (agent.args.<name>)."""
    # check_only: the tools check their settings and build nothing (`agentrl plan` builds nothing; a
    # search index is built when the run builds its agents).
    with tempfile.TemporaryDirectory(prefix="agentrl-stand-in-") as tmp, check_only():
        stand_in = StandInTokenizer(Path(tmp) / "tokenizer")
        for tag in tags:
            _check_tag_args(cfg, tag, stand_in)


def _check_tag_args(cfg: Config, tag: TagPlan, stand_in: StandInTokenizer) -> None:
    error = _build_error(cfg, tag, None, stand_in)
    args = tag.agent_args
    if error is None or not args or _build_error(cfg, tag, {}, stand_in) is not None:
        return  # fine, or the stand-in tokenizer is not enough to judge: the real build will tell
    for name, value in args.items():  # the one argument that fails on its own the same way, if any
        alone = _build_error(cfg, tag, {name: value}, stand_in)
        # The same refusal alone: this argument is the culprit (a tool whose required setting is
        # missing without its tool_args fails alone too, but for another reason).
        if alone is not None and alone == error:
            raise ConfigError(f"{tag.agent_section}.args.{name}={shown(value)} is rejected by agent type "
                              f"'{tag.agent_type}': {alone.split(': ', 1)[-1]}")
    raise ConfigError(error)  # only the arguments together are rejected


def _build_error(cfg: Config, tag: TagPlan, args: dict | None, stand_in: StandInTokenizer) -> str | None:
    """Why building `tag`'s agent (with `args` instead of the configured ones) fails, or None.

    Only a rejection of the arguments counts (make_agent turns TypeError / ValueError into a
    ConfigError); a constructor that needs more of the tokenizer than the stand-in has is
    checked when the real agent is built.
    """
    # The stand-in has only what agent constructors read of a tokenizer; one that reads more fails
    # here with an error that is no verdict (below).
    try:
        make_agent(tag if args is None else replace(tag, agent_args=args), cfg.rollout, cast(Tokenizer, stand_in))
    except ConfigError as e:
        return str(e)
    except Exception:  # noqa: BLE001 (the stand-in is not enough for this agent: no verdict)
        return None
    return None
