"""Where a run's engine lives, asked of its engine kind (runtime/assembly/engine_kinds/), and the
checks of that before any model is built.

`make_engine` is what `build_rollout` calls: the engine kind of the plan makes it (the in-process
`LocalEngine`, a `RemoteEngine` on engine.urls that first receives the run's own initial weights,
version 0, so a run never depends on what a server held before, or vLLM's). `check_serving` runs
in the preflight: the kind's own checks (every server URL answers and takes the run's key on its
control routes; vLLM's interpreter), and an OpenAI-client agent's entry must import and be
`async def f(client, env, task)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.agents.openai import resolve_entry
from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.llm.engine import InferenceEngine
from agentrl.llm.remote.engine import check_server
from agentrl.runtime.assembly.plan_types import EngineKind, RunPlan
from agentrl.tokenizer import Tokenizer


def check_serving(cfg: Config, kind: EngineKind) -> None:
    """engine.kind's own checks (`kind`: its object); OpenAI-client agents' entries are usable
    (one line each)."""
    kind.check(cfg)
    for tag in cfg.env_definitions():
        agent = cfg.agent_for(tag)
        if agent.type == "openai":
            section = f"custom_envs.{tag}.agent" if cfg.env_definitions()[tag].agent is not None else "agent"
            try:
                resolve_entry(agent.args.get("entry"))
            except ValueError as err:
                raise ConfigError(str(err).replace("agent.args.entry", f"{section}.args.entry")) from None


def check_servers(cfg: Config, protocol: str, hint: str) -> None:
    """Every server of engine.urls answers in `protocol` and takes the run's key (`hint`: what to
    do when one does not answer)."""
    for i, url in enumerate(cfg.engine.urls):
        why = check_server(url, protocol, engine_key(cfg))
        if why is not None:
            raise ConfigError(f"engine.urls[{i}]={url} {why}{'' if why.startswith('refused the') else hint}")


def engine_key(cfg: Config) -> str | None:
    """The key for the servers of engine.urls: engine.api_key, or the first line of engine.api_key_file."""
    e = cfg.engine
    if e.api_key_file is None:
        return e.api_key
    try:
        key = Path(e.api_key_file).expanduser().read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError as err:
        raise ConfigError(f"engine.api_key_file={e.api_key_file}: cannot read it ({err.strerror or err}); give the "
                          "key file whose path `agentrl serve` printed at start") from None
    if not key or not key[0].strip() or not (key[0].isascii() and key[0].isprintable()) or " " in key[0].strip():
        raise ConfigError(f"engine.api_key_file={e.api_key_file} holds no key (its first line must be the key, "
                          "printable ASCII without spaces)")
    return key[0].strip()


def make_engine(run_plan: RunPlan, model: Any, tokenizer: Tokenizer, device: torch.device) -> InferenceEngine:
    """The run's engine, as the plan's engine kind makes it (a copy of `model` in this process, the
    servers of engine.urls, or vLLM's), serving `model`'s weights as version 0."""
    return run_plan.engine_kind.make(run_plan, model, tokenizer, device)
