"""Where a run's engine lives (this process, or inference servers), the checks of that before
any model is built, and `agentrl serve`.

`make_engine` is what `build_rollout` calls: the in-process `LocalEngine`, or a `RemoteEngine`
on engine.urls that first receives the run's own initial weights (version 0), so a run never
depends on what a server held before. `check_serving` runs in the preflight: every remote URL
must answer (and take the run's key on its control routes), and an OpenAI-client agent's entry
must import and be `async def f(client, env, task)`. `serve` builds the config's policy exactly
as training does and serves it over HTTP; without serve.api_key it makes an admin key for the
routes that change the server, prints it once and writes it (mode 0600) to the run folder, where
a run on engine.kind=remote reads it (engine.api_key_file).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Callable
from pathlib import Path
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
            why = check_server(url, e.protocol, engine_key(cfg))
            if why is not None:
                hint = "" if why.startswith("refused the") else ("; start the server first (e.g. `agentrl serve CONFIG "
                                                "serve.port=PORT`) or fix engine.urls")
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
                          "key file `agentrl serve` printed at start") from None
    if not key or not key[0].strip() or not (key[0].isascii() and key[0].isprintable()) or " " in key[0].strip():
        raise ConfigError(f"engine.api_key_file={e.api_key_file} holds no key (its first line must be the key, "
                          "printable ASCII without spaces)")
    return key[0].strip()


def make_engine(cfg: Config, model: Any, tokenizer: Any, device: torch.device) -> Any:
    """The run's engine: a copy of `model` in this process, or the servers of engine.urls."""
    e = cfg.engine
    if e.kind == "local":
        engine_model = copy.deepcopy(model).to(device=device, dtype=DTYPES[cfg.model.dtype])
        return LocalEngine.from_config(engine_model, tokenizer, e, cfg.rollout.max_model_len, seed=cfg.seed)
    key = engine_key(cfg)
    if e.protocol == "agentrl":
        ours = fingerprint(tokenizer)
        for i, url in enumerate(e.urls):
            theirs = server_info(url, key).get("tokenizer")
            if theirs != ours:
                raise ConfigError(f"engine.urls[{i}]={url} serves a model with another tokenizer than this run's; "
                                  "start it from the same config (model.path, model.tiny, env) as the run")
    engine = RemoteEngine(e.urls, e.protocol, api_key=key, timeout=e.request_timeout, max_retries=e.max_retries,
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
    from agentrl.runtime.run_folder import check_folder

    cfg = copy.deepcopy(cfg)
    cfg.engine.kind = "local"  # the server's own engine is in-process, whatever the file says
    if cfg.serve.weights_dir is not None and not Path(cfg.serve.weights_dir).is_dir():
        raise ConfigError(f"serve.weights_dir={cfg.serve.weights_dir} is not a folder; give the folder the "
                          "server may load weight files from (a run's engine.weights_dir), or null")
    run_dir = check_folder(cfg) if cfg.serve.api_key is None else None  # before the model: errors come first
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    model, tokenizer, _ = build_policy(cfg, log)
    model = model.to(device=device, dtype=DTYPES[cfg.model.dtype])
    engine = LocalEngine.from_config(model, tokenizer, cfg.engine, cfg.rollout.max_model_len, seed=cfg.seed)
    name = served_model_name(cfg.serve.served_model_name, cfg.model.path)
    handle = start_server(engine, tokenizer, cfg.serve, model_name=name)
    print(f"agentrl serve: {handle.url} (model {name!r}, OpenAI base_url {handle.url}/v1"
          f"{', API key required' if cfg.serve.api_key else ''})", file=sys.stdout, flush=True)
    key_file = None
    try:
        if run_dir is not None:
            key_file = write_secret(run_dir / f"serve-{handle.url.rsplit(':', 1)[1]}.key", str(handle.admin_key))
            print(f"agentrl serve: admin key {handle.admin_key} (the routes that change the server: weights, state, "
                  f"cache, metrics), also in {key_file} (mode 0600); a run on this server reads it with "
                  f"engine.api_key_file={key_file}", file=sys.stdout, flush=True)
        while handle.thread.is_alive():
            handle.thread.join(0.5)  # wakes up for signals (Ctrl-C, SIGTERM as KeyboardInterrupt)
    except KeyboardInterrupt:
        log("agentrl serve: stopping")
    finally:
        handle.stop()
        if key_file is not None:
            with contextlib.suppress(OSError):
                key_file.unlink()  # the key dies with the server


def write_secret(path: Path, text: str) -> Path:
    """Write `text` to `path`, readable by this user only (mode 0600 from its creation on, through
    a new temporary file renamed over `path`, so no one can open it in between)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
    return path
