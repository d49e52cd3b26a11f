"""Where a run's engine lives (this process, or inference servers), the checks of that before
any model is built, and `agentrl serve`.

`make_engine` is what `build_rollout` calls: the in-process `LocalEngine`, or a `RemoteEngine`
on engine.urls that first receives the run's own initial weights (version 0), so a run never
depends on what a server held before. `check_serving` runs in the preflight: every remote URL
must answer, and an OpenAI-client agent's entry must import and be `async def f(client, env,
task)`. `serve` builds the config's policy exactly as training does and serves it over HTTP.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import torch

from agentrl.agents.openai import resolve_entry
from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.llm.local import LocalEngine
from agentrl.llm.remote import RemoteEngine, check_server, server_info
from agentrl.models.embedded import fingerprint
from agentrl.models.loading import DTYPES


def check_serving(cfg: Config) -> None:
    """Remote servers answer; OpenAI-client agents' entries are usable (one line each)."""
    e = cfg.engine
    if e.kind == "remote":
        for i, url in enumerate(e.urls):
            why = check_server(url, e.protocol, e.api_key)
            if why is not None:
                raise ConfigError(f"engine.urls[{i}]={url} {why}; start the server first (e.g. `agentrl serve "
                                  "CONFIG serve.port=PORT`) or fix engine.urls")
    for tag in cfg.env_definitions():
        agent = cfg.agent_for(tag)
        if agent.type == "openai":
            section = f"custom_envs.{tag}.agent" if cfg.env_definitions()[tag].agent is not None else "agent"
            try:
                resolve_entry(agent.args.get("entry"))
            except ValueError as err:
                raise ConfigError(str(err).replace("agent.args.entry", f"{section}.args.entry")) from None


def make_engine(cfg: Config, model: Any, tokenizer: Any, device: torch.device) -> Any:
    """The run's engine: a copy of `model` in this process, or the servers of engine.urls."""
    e = cfg.engine
    if e.kind == "local":
        engine_model = copy.deepcopy(model).to(device=device, dtype=DTYPES[cfg.model.dtype])
        return LocalEngine.from_config(engine_model, tokenizer, e, cfg.rollout.max_model_len, seed=cfg.seed)
    if e.protocol == "agentrl":
        ours = fingerprint(tokenizer)
        for i, url in enumerate(e.urls):
            theirs = server_info(url, e.api_key).get("tokenizer")
            if theirs != ours:
                raise ConfigError(f"engine.urls[{i}]={url} serves a model with another tokenizer than this run's; "
                                  "start it from the same config (model.path, model.tiny, env) as the run")
    engine = RemoteEngine(e.urls, e.protocol, api_key=e.api_key, timeout=e.request_timeout, max_retries=e.max_retries,
                          weights_dir=e.weights_dir, model_config=getattr(model, "config", None), seed=cfg.seed)
    engine.load_weights({k: v.detach() for k, v in model.state_dict().items()}, version=0)
    return engine


def serve(cfg: Config, log: Callable[[str], None] = print) -> None:
    """`agentrl serve`: build the config's policy and serve it until Ctrl-C or SIGTERM.

    The server runs on a thread of its own (`start_server`, the code tests and Ray actors use)
    while the main thread waits for the signal: torch's thread pool, driven from the main thread
    of a busy machine, was measured 10-100x slower than from another thread."""
    from agentrl.llm.server import served_model_name, start_server
    from agentrl.runtime.build import build_policy, resolve_device, seed_everything

    cfg = copy.deepcopy(cfg)
    cfg.engine.kind = "local"  # the server's own engine is in-process, whatever the file says
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    model, tokenizer, _ = build_policy(cfg, log)
    model = model.to(device=device, dtype=DTYPES[cfg.model.dtype])
    engine = LocalEngine.from_config(model, tokenizer, cfg.engine, cfg.rollout.max_model_len, seed=cfg.seed)
    name = served_model_name(cfg.serve.served_model_name, cfg.model.path)
    handle = start_server(engine, tokenizer, cfg.serve, model_name=name)
    print(f"agentrl serve: {handle.url} (model {name!r}, OpenAI base_url {handle.url}/v1"
          f"{', API key required' if cfg.serve.api_key else ''})", file=sys.stdout, flush=True)
    try:
        while handle.thread.is_alive():
            handle.thread.join(0.5)  # wakes up for signals (Ctrl-C, SIGTERM as KeyboardInterrupt)
    except KeyboardInterrupt:
        log("agentrl serve: stopping")
    finally:
        handle.stop()
