"""OpenEnv apps served by agentrl on loopback, and the user's `module:attr` names loaded in one line.

`env.args.app=module:app` names an ASGI app (openenv-core's `create_app(...)`); `serve_app` starts it
under uvicorn on 127.0.0.1 at a free port, in a daemon thread of this process, once per process
(each Ray env manager serves its own), and stops it when the process exits (`stop_apps`).
"""

from __future__ import annotations

import atexit
import importlib
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.registry import import_file

_SERVED: dict[str, tuple[str, Any, threading.Thread]] = {}  # app name -> (url, uvicorn server, its thread)
_LOCK = threading.Lock()


def load_attr(spec: Any, field: str, what: str) -> Any:
    """The object `module:attr` names (the module a name, or a .py path); a ConfigError line when it cannot."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ConfigError(f"openenv: {field}={spec!r} is invalid; {field} must be 'module:attr' naming {what} "
                          "(the module a name, or a .py path such as examples/openenv_server:app)")
    module_name, name = spec.split(":")
    try:
        path = Path(module_name if module_name.endswith(".py") else module_name + ".py").expanduser()
        if "/" in module_name or module_name.endswith(".py") or path.is_file():
            module = import_file(path)
        else:
            module = importlib.import_module(module_name)
    except SystemExit as e:
        raise ConfigError(f"openenv: {field}={spec!r}: the module called sys.exit({e.code!r}) while being "
                          "imported") from None
    except Exception as e:  # noqa: BLE001 (whatever the user's module raises, one line names it)
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"openenv: {field}={spec!r}: cannot import {module_name!r}: {type(e).__name__}: {first}") \
            from None
    if not hasattr(module, name):
        raise ConfigError(f"openenv: {field}={spec!r}: module {module_name!r} has no {name!r}")
    return getattr(module, name)


def serve_app(spec: str, timeout: float) -> str:
    """The URL of the app `spec` names, served on loopback (started on the first call in this process)."""
    with _LOCK:
        if spec in _SERVED:
            return _SERVED[spec][0]
        app = load_attr(spec, "env.args.app", "an OpenEnv ASGI app (openenv-core's create_app(...))")
        if not callable(app):
            raise ConfigError(f"openenv: env.args.app={spec!r} is a {type(app).__name__}, not an ASGI app")
        url, server, thread = _start(app, timeout, spec)
        _SERVED[spec] = (url, server, thread)
        return url


class _ClientGone(logging.Filter):
    """Drops uvicorn's error for a WebSocket the client closed first (openenv-core 0.3's server closes each
    session's socket again after that and logs the failure; an episode cut off by env.max_turns ends so
    when its loop ends, with nothing lost)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return type(error).__name__ not in ("WebSocketDisconnect", "ClientDisconnected", "WebSocketDisconnected")


def _start(app: Any, timeout: float, spec: str) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ClientGone) for f in error_log.filters):
        error_log.addFilter(_ClientGone())

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"openenv app {spec}")
    thread.start()
    # Wait for uvicorn's startup (its own flag); a thread that ends first failed to start.
    deadline = time.monotonic() + timeout
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        server.should_exit = True
        raise ConfigError(f"openenv: env.args.app={spec!r}: uvicorn did not start the app within {timeout:g} s "
                          "(env.args.timeout; see the log above)")
    return f"http://127.0.0.1:{port}", server, thread


def stop_apps(spec: str | None = None, timeout: float = 10.0) -> None:
    """Stop the app `spec` names, or every app this process serves (at exit)."""
    with _LOCK:
        specs = list(_SERVED) if spec is None else [spec] if spec in _SERVED else []
        served = [_SERVED.pop(s) for s in specs]
    for _, server, thread in served:
        server.should_exit = True
        thread.join(timeout)


def served_urls() -> dict[str, str]:
    """{app: url} of the apps this process serves."""
    with _LOCK:
        return {spec: url for spec, (url, _, _) in _SERVED.items()}


atexit.register(stop_apps)
