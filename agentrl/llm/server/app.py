"""The policy over HTTP (FastAPI): OpenAI's routes, vLLM's token route, our own control routes,
and per-episode sessions for agents written against the `openai` client.

    GET  /health                        liveness, policy version (no key needed)
    GET  /v1/models                     the served model id
    POST /v1/chat/completions           OpenAI chat (+ vLLM's return_token_ids, top_k); stream=true: SSE
    POST /v1/completions                OpenAI text completions (prompt text or token ids)
    POST /inference/v1/generate         vLLM's token-in/token-out route
    POST /agentrl/generate              token ids in, Completion out (every SamplingParams field, per-id versions)
    POST /agentrl/weights               new weights: JSON {path, version} or a safetensors body (?version=N)
    POST /agentrl/adapter               a LoRA run's new adapter, in the same two forms (its peft config inside)
    GET  /agentrl/info | POST /agentrl/state | /agentrl/reset_prefix_cache | /agentrl/metrics
    (weights, adapter, state, reset and metrics change the server: they always take a key, guard.py)
    POST /sessions, GET|DELETE /sessions/<id>, POST /sessions/<id>/reward,
         /sessions/<id>/v1/models, /sessions/<id>/v1/chat/completions

`build_app(engine, tokenizer, cfg)` makes the app (with a random admin key when cfg has no
api_key); `start_server(...)` runs one on a background thread (port 0: a free one) and returns a
`ServerHandle` (`.url`, `.admin_key`, `.stop()`), for `agentrl serve`, tests and Ray actors;
`session_server()` runs one in the current event loop for the sessions of a training run
(loopback, a random key). Without a key a server binds only a loopback address; every server
answers only requests naming its own host (guard.py's AllowedHosts: the loopback names, the
address it bound, serve.allowed_hosts). Handlers reach
the engine in the loop it lives in (`engine_loop`; None: the server's own), never through a
second engine. Every malformed request gets a 4xx JSON error and the server keeps serving; the
routes themselves are in openai_routes.py (OpenAI's, vLLM's, sessions) and agentrl_routes.py
(ours, control), what they share in state.py, what a request must show in guard.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrl.config.serve import ServeConfig, host_address, is_loopback
from agentrl.errors import EngineError
from agentrl.llm.server.agentrl_routes import add_agentrl_routes, add_control_routes
from agentrl.llm.server.chat_messages import MessageError
from agentrl.llm.server.guard import AllowedHosts, Guard, TimedH11Protocol
from agentrl.llm.server.openai_format import error_body
from agentrl.llm.server.openai_routes import add_openai_routes, add_session_routes, add_vllm_routes
from agentrl.llm.server.openai_schema import RequestError
from agentrl.llm.server.sessions import SessionStore
from agentrl.llm.server.state import ServerState
from agentrl.tokenizer import Tokenizer


def build_app(engine: Any, tokenizer: Tokenizer | None, cfg: ServeConfig | None = None, *,
              model_name: str | None = None, engine_loop: asyncio.AbstractEventLoop | None = None,
              sessions: SessionStore | None = None) -> FastAPI:
    """The FastAPI app serving `engine` (with `tokenizer`) under the caps of `cfg` (engine and
    tokenizer None: a server that only hosts sessions)."""
    cfg = cfg or ServeConfig()
    app = FastAPI(title="agentrl", docs_url=None, redoc_url=None, openapi_url=None)
    state = ServerState(engine, tokenizer, cfg, model_name or cfg.served_model_name or "agentrl", engine_loop,
                        sessions or SessionStore(), admin_key=cfg.api_key or secrets.token_urlsafe(32))
    app.state.agentrl = state
    app.state.hosts = AllowedHosts(cfg.allowed_hosts)  # the bound address joins once bound (`_bound`)
    app.add_middleware(Guard, key=cfg.api_key, admin_key=state.admin_key, idle_timeout=cfg.idle_timeout,
                       hosts=app.state.hosts)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, e: RequestError) -> JSONResponse:
        return JSONResponse(error_body(e.message, e.status, e.param, e.code), status_code=e.status,
                            headers={"connection": "close"} if e.close else None)

    @app.exception_handler(MessageError)
    async def message_error(request: Request, e: MessageError) -> JSONResponse:
        return JSONResponse(error_body(str(e), 400, e.param), status_code=400)

    @app.exception_handler(EngineError)
    async def engine_error(request: Request, e: EngineError) -> JSONResponse:
        return JSONResponse(error_body(f"engine: {e}", 400, code="engine_error"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(e.detail), e.status_code), status_code=e.status_code)

    for add in (add_openai_routes, add_vllm_routes, add_agentrl_routes, add_control_routes, add_session_routes):
        add(app, state)
    return app


class ServerHandle:
    """A server running on a background thread: its `url`, its keys, its session store, `stop()`."""

    def __init__(self, server: Any, thread: threading.Thread, url: str, app: FastAPI, api_key: str | None) -> None:
        self.server, self.thread, self.url, self.app, self.api_key = server, thread, url, app, api_key

    @property
    def admin_key(self) -> str | None:
        """The key of the control routes (weights, state, cache, metrics): serve.api_key, or the one
        made at start-up (None for an app that is not build_app's)."""
        state = getattr(self.app.state, "agentrl", None)
        return state.admin_key if state is not None else None

    @property
    def sessions(self) -> SessionStore:
        """The server's sessions (open one in-process with `sessions.open(...)`)."""
        return self.app.state.agentrl.sessions

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout)


def bind(host: str, port: int, keyed: bool = True) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one); without a key (`keyed` false)
    only on a loopback address, checked on the address bound, not on how `host` is spelt."""
    address = host_address(host)
    if not keyed and not is_loopback(address):
        raise EngineError(f"serve.host={host} is not a loopback address: a server without serve.api_key binds "
                          "only 127.x, ::1 or localhost")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted connections inherit it
    try:
        sock.bind((address, port))
        bound = sock.getsockname()[0]
    except (OSError, UnicodeError) as e:
        sock.close()
        raise EngineError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e} "
                          "(set serve.host and serve.port, 0 for a free port)") from None
    if not keyed and not is_loopback(bound):  # what the kernel bound, whatever resolved the name
        sock.close()
        raise EngineError(f"serve.host={host} bound {bound}, not a loopback address; set serve.api_key")
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def uvicorn_server(app: FastAPI, idle_timeout: float = 30.0) -> Any:
    """A uvicorn server for `app` (quiet: errors only) that closes connections silent for `idle_timeout` s."""
    import uvicorn

    # uvicorn annotates timeout_keep_alive int but only hands it to loop.call_later: a fractional
    # serve.idle_timeout (a float config field) works as is, and rounding it would change it.
    config = uvicorn.Config(app, log_level="error", access_log=False,
                            timeout_keep_alive=idle_timeout,  # type: ignore[arg-type]  # see above: seconds as a float
                            http=TimedH11Protocol, lifespan="off", ws="none",
                            log_config=None)  # log_config=None: leave the process's logging alone
    return uvicorn.Server(config)


def _bound(app: FastAPI, sock: socket.socket, host: str) -> None:
    """Tell the app's Guard the address its socket bound (`host`: as written), a name it answers to."""
    hosts = getattr(app.state, "hosts", None)
    if hosts is not None:
        hosts.bound(sock.getsockname()[0], host_address(host))


def _idle_timeout(app: FastAPI) -> float:
    state = getattr(app.state, "agentrl", None)
    return state.cfg.idle_timeout if state is not None else ServeConfig.idle_timeout


def _url(host: str, port: int) -> str:
    """The server's base URL: the address bound (localhost: 127.0.0.1, which needs no resolver)."""
    address = host_address(host)
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def start_server(engine: Any, tokenizer: Tokenizer, cfg: ServeConfig | None = None, host: str | None = None,
                 port: int | None = None, *, model_name: str | None = None,
                 engine_loop: asyncio.AbstractEventLoop | None = None) -> ServerHandle:
    """Serve `engine` on a background thread (the engine then lives in that thread's loop unless
    `engine_loop` says where it does); returns once it accepts connections."""
    cfg = cfg or ServeConfig()
    app = build_app(engine, tokenizer, cfg, model_name=model_name, engine_loop=engine_loop)
    return run_app(app, cfg.host if host is None else host, cfg.port if port is None else port, cfg.api_key)


def run_app(app: FastAPI, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None) -> ServerHandle:
    """Run an ASGI `app` with uvicorn on a background thread; returns once it accepts connections
    (without `api_key`, on loopback only)."""
    sock = bind(host, port, keyed=api_key is not None)
    _bound(app, sock, host)
    server = uvicorn_server(app, _idle_timeout(app))

    def run() -> None:
        asyncio.run(server.serve(sockets=[sock]))

    thread = threading.Thread(target=run, name="agentrl-server", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.01)
    if not thread.is_alive():
        raise EngineError(f"the server on {host} did not start")
    return ServerHandle(server, thread, _url(host, sock.getsockname()[1]), app, api_key)


@dataclass
class SessionHost:
    """A session server running in an event loop's own task: `url`, `api_key`, `sessions`."""

    url: str
    api_key: str
    sessions: SessionStore
    server: Any
    task: asyncio.Task | None = None
    ssl_context: Any = None  # shared by the sessions' HTTP clients (a new one per client costs ~10 ms of CPU)

    def stop(self) -> None:
        """Stop serving (the task ends at the server's next tick)."""
        self.server.should_exit = True


_HOSTS: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Task]] = {}  # id(loop) -> (loop, its host's start)


async def session_server() -> SessionHost:
    """The session server of the running event loop, started on first use (loopback, a free
    port, a random key), serving in this loop's own task.

    It serves no engine of its own: each session generates through its episode's LLM client.
    Living in the loop the episodes and their engine live in, a request never crosses threads:
    a server on a thread of its own would fight the engine for the GIL and the CPU on every step
    (measured on 2 busy cores: the engine's steps were 50x slower)."""
    loop = asyncio.get_running_loop()
    for key, (other, _) in list(_HOSTS.items()):
        if other.is_closed():
            del _HOSTS[key]  # its loop ended, and its server with it
    entry = _HOSTS.get(id(loop))
    pending = entry[1] if entry is not None and entry[0] is loop else None
    if pending is None or (pending.done() and (pending.exception() or pending.result().task.done())):
        pending = loop.create_task(_start_session_host())
        _HOSTS[id(loop)] = (loop, pending)
    return await asyncio.shield(pending)


async def _start_session_host() -> SessionHost:
    key = secrets.token_urlsafe(24)
    cfg = ServeConfig(host="127.0.0.1", port=0, api_key=key, max_tokens=2**24, max_n=64)
    app = build_app(None, None, cfg, model_name="agentrl-session")
    server, task, url = await serve_in_loop(app, cfg.host, 0, name="agentrl-session-server")
    return SessionHost(url, key, app.state.agentrl.sessions, server, task, ssl.create_default_context())


async def serve_in_loop(app: FastAPI, host: str, port: int = 0, *,
                        name: str = "agentrl-server") -> tuple[Any, asyncio.Task, str]:
    """Run `app` in the running event loop's own task (no thread: requests reach an engine living
    in this loop without crossing threads); (server, task, url) once it accepts connections."""
    state = getattr(app.state, "agentrl", None)
    sock = bind(host, port, keyed=state is None or state.cfg.api_key is not None)
    _bound(app, sock, host)
    server = uvicorn_server(app, _idle_timeout(app))
    server.capture_signals = contextlib.nullcontext  # Ctrl-C stays the process's, even from the main thread

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            sock.close()
    task = asyncio.get_running_loop().create_task(serve(), name=name)
    while not server.started:
        if task.done():
            task.result()  # raises why it stopped
            raise EngineError(f"the server on {host} stopped while starting")
        await asyncio.sleep(0.001)
    return server, task, _url(host, sock.getsockname()[1])


def served_model_name(cfg_name: str | None, model_path: str | None) -> str:
    """serve.served_model_name, else the folder name of model.path, else agentrl."""
    return cfg_name or (Path(model_path).name if model_path else "agentrl")
