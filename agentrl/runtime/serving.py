"""`agentrl serve`: the config's policy, built exactly as training builds it, served over HTTP.

Without serve.api_key it makes an admin key for the routes that change the server and writes it
(mode 0600) to the run folder, where a run on engine.kind=remote reads it (engine.api_key_file,
runtime/assembly/engines.py); it prints where the file is, never the key (stdout ends up in logs).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable
from pathlib import Path

from agentrl.atomic import write_atomic
from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.llm.local.engine import LocalEngine
from agentrl.llm.server.app import served_model_name, start_server
from agentrl.models.loading import DTYPES
from agentrl.runtime.assembly.plan import plan
from agentrl.runtime.assembly.policy import build_policy
from agentrl.runtime.process import resolve_device, seed_everything
from agentrl.runtime.run_folder import check_folder


def serve(cfg: Config, log: Callable[[str], None] = print) -> None:
    """`agentrl serve`: build the config's policy and serve it until Ctrl-C or SIGTERM.

    The server runs on a thread of its own (`start_server`, the code tests and Ray actors use)
    while the main thread waits for the signal: torch's thread pool, driven from the main thread
    of a busy machine, was measured 10-100x slower than from another thread."""
    cfg = copy.deepcopy(cfg)
    cfg.engine.kind = "local"  # the server's own engine is in-process, whatever the file says
    if cfg.serve.weights_dir is not None and not Path(cfg.serve.weights_dir).is_dir():
        raise ConfigError(f"serve.weights_dir={cfg.serve.weights_dir} is not a folder; give the folder the "
                          "server may load weight files from (a run's engine.weights_dir), or null")
    run_dir = check_folder(cfg) if cfg.serve.api_key is None else None  # before the model: errors come first
    run_plan = plan(cfg)  # every model-free check, before the model is built or warm-started
    seed_everything(run_plan.seed)
    device = resolve_device(run_plan.device)
    model, tokenizer = build_policy(run_plan, log)
    model = model.to(device=device, dtype=DTYPES[run_plan.model.dtype])
    engine = LocalEngine.from_config(model, tokenizer, run_plan.engine, run_plan.rollout.max_model_len,
                                     seed=run_plan.seed)
    name = served_model_name(cfg.serve.served_model_name, cfg.model.path)
    handle = start_server(engine, tokenizer, cfg.serve, model_name=name)
    print(f"agentrl serve: {handle.url} (model {name!r}, OpenAI base_url {handle.url}/v1"
          f"{', API key required' if cfg.serve.api_key else ''})", file=sys.stdout, flush=True)
    key_file = None
    try:
        if run_dir is not None:
            key_file = write_secret(run_dir / f"serve-{handle.url.rsplit(':', 1)[1]}.key", str(handle.admin_key))
            print(f"agentrl serve: admin key (the routes that change the server: weights, state, cache, metrics) "
                  f"in {key_file} (mode 0600, removed at stop); a run on this server reads it with "
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
    return write_atomic(path, text + "\n", private=True)
