"""Where a run's engine lives (this process, or inference servers), and the checks of that before
any model is built.

`make_engine` is what `build_rollout` calls: the in-process `LocalEngine`, or a `RemoteEngine`
on engine.urls that first receives the run's own initial weights (version 0), so a run never
depends on what a server held before. `check_serving` runs in the preflight: every remote URL
must answer (and take the run's key on its control routes), and an OpenAI-client agent's entry
must import and be `async def f(client, env, task)`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from agentrl.agents.openai import resolve_entry
from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.llm.local.engine import LocalEngine
from agentrl.llm.remote.engine import RemoteEngine, check_server, server_info
from agentrl.models.embedded import fingerprint
from agentrl.models.loading import DTYPES
from agentrl.runtime.build.plan_types import RunPlan
from agentrl.runtime.build.vllm_engine import check_vllm_python, vllm_engine
from agentrl.tokenizer import Tokenizer


def check_serving(cfg: Config) -> None:
    """Remote servers answer, or vLLM's interpreter can start them; OpenAI-client agents' entries
    are usable (one line each)."""
    e = cfg.engine
    if e.kind == "vllm" and not e.urls:
        check_vllm_python(e.vllm.python)
    if e.kind in ("remote", "vllm"):
        for i, url in enumerate(e.urls):
            why = check_server(url, e.protocol if e.kind == "remote" else "vllm", engine_key(cfg))
            if why is not None:
                hint = "" if why.startswith("refused the") else (
                    "; start the server first (e.g. `agentrl serve CONFIG serve.port=PORT`) or fix engine.urls"
                    if e.kind == "remote" else "; start the vLLM server first, with agentrl's weight transport "
                    "(docs/engines.md), or fix engine.urls")
                raise ConfigError(f"engine.urls[{i}]={url} {why}{hint}")
    for tag in cfg.env_definitions():
        agent = cfg.agent_for(tag)
        if agent.type == "openai":
            section = f"custom_envs.{tag}.agent" if cfg.env_definitions()[tag].agent is not None else "agent"
            try:
                resolve_entry(agent.args.get("entry"))
            except ValueError as err:
                raise ConfigError(str(err).replace("agent.args.entry", f"{section}.args.entry")) from None


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


def make_engine(run_plan: RunPlan, model: Any, tokenizer: Tokenizer, device: torch.device) -> Any:
    """The run's engine: a copy of `model` in this process, the servers of engine.urls, or vLLM's."""
    e = run_plan.engine
    if e.kind == "local":
        engine_model = copy.deepcopy(model).to(device=device, dtype=DTYPES[run_plan.model.dtype])
        return LocalEngine.from_config(engine_model, tokenizer, e, run_plan.rollout.max_model_len, seed=run_plan.seed)
    if e.kind == "vllm":
        return vllm_engine(run_plan, model, tokenizer)
    key = run_plan.engine_key
    if e.protocol == "agentrl":
        ours = fingerprint(tokenizer)
        for i, url in enumerate(e.urls):
            theirs = server_info(url, key).get("tokenizer")
            if theirs != ours:
                raise ConfigError(f"engine.urls[{i}]={url} serves a model with another tokenizer than this run's; "
                                  "start it from the same config (model.path, model.tiny, env) as the run")
    engine = RemoteEngine(e.urls, e.protocol, api_key=key, timeout=e.request_timeout, max_retries=e.max_retries,
                          weights_dir=e.weights_dir, model_config=getattr(model, "config", None), seed=run_plan.seed)
    engine.load_weights({k: v.detach() for k, v in model.state_dict().items()}, version=0)
    return engine
