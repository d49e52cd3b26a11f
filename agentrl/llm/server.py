"""The policy over HTTP (FastAPI): OpenAI's routes, vLLM's token route, our own control routes,
and per-episode sessions for agents written against the `openai` client.

    GET  /health                        liveness, policy version (no key needed)
    GET  /v1/models                     the served model id
    POST /v1/chat/completions           OpenAI chat (+ vLLM's return_token_ids, top_k); stream=true: SSE
    POST /v1/completions                OpenAI text completions (prompt text or token ids)
    POST /inference/v1/generate         vLLM's token-in/token-out route
    POST /agentrl/generate              token ids in, Completion out (every SamplingParams field, per-id versions)
    POST /agentrl/weights               new weights: JSON {path, version} or a safetensors body (?version=N)
    GET  /agentrl/info | POST /agentrl/state | /agentrl/reset_prefix_cache | /agentrl/metrics
    POST /sessions, GET|DELETE /sessions/<id>, POST /sessions/<id>/reward,
         /sessions/<id>/v1/models, /sessions/<id>/v1/chat/completions

`build_app(engine, tokenizer, cfg)` makes the app; `start_server(...)` runs one on a background
thread (port 0: a free one) and returns a `ServerHandle` (`.url`, `.stop()`), for `agentrl
serve`, tests and Ray actors; `session_server()` runs one in the current event loop for the
sessions of a training run (loopback, a random key). Handlers reach the engine in the loop it lives in (`engine_loop`; None: the
server's own), never through a second engine. Every malformed request gets a 4xx JSON error and
the server keeps serving; the routes themselves are in server_routes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrl.config_serve import ServeConfig
from agentrl.errors import EngineError
from agentrl.llm.chat_messages import MessageError
from agentrl.llm.openai_format import error_body
from agentrl.llm.openai_schema import RequestError
from agentrl.llm.sessions import SessionStore, in_loop

OPEN_PATHS = ("/health",)  # answered without the API key (load balancers, readiness probes)


@dataclass
class ServerState:
    """What the routes share: the engine and where it lives, the tokenizer, caps, sessions."""

    engine: Any  # an InferenceEngine, or None for a server that only hosts sessions
    tokenizer: Any
    cfg: ServeConfig
    model_name: str
    engine_loop: asyncio.AbstractEventLoop | None = None  # None: the server's own loop
    sessions: SessionStore = field(default_factory=SessionStore)
    inflight: int = 0

    async def call(self, fn: Any, *args: Any) -> Any:
        """Run engine method `fn(*args)` (sync or async) in the engine's loop."""
        if self.engine is None:
            raise RequestError(404, "this server only hosts sessions (/sessions/<id>/v1); it serves no engine")

        async def run() -> Any:
            out = fn(*args)
            return await out if asyncio.iscoroutine(out) else out
        return await in_loop(self.engine_loop, run)

    def version(self) -> int:
        """The policy version the engine serves (0 without an engine)."""
        return int(getattr(self.engine, "policy_version", 0)) if self.engine is not None else 0


def build_app(engine: Any, tokenizer: Any, cfg: ServeConfig | None = None, *, model_name: str | None = None,
              engine_loop: asyncio.AbstractEventLoop | None = None, sessions: SessionStore | None = None) -> FastAPI:
    """The FastAPI app serving `engine` (with `tokenizer`) under the caps of `cfg`."""
    from agentrl.llm.server_routes import add_routes

    cfg = cfg or ServeConfig()
    app = FastAPI(title="agentrl", docs_url=None, redoc_url=None, openapi_url=None)
    state = ServerState(engine, tokenizer, cfg, model_name or cfg.served_model_name or "agentrl", engine_loop,
                        sessions or SessionStore())
    app.state.agentrl = state
    app.add_middleware(Guard, key=cfg.api_key.encode() if cfg.api_key else None)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, e: RequestError) -> JSONResponse:
        return JSONResponse(error_body(e.message, e.status, e.param, e.code), status_code=e.status)

    @app.exception_handler(MessageError)
    async def message_error(request: Request, e: MessageError) -> JSONResponse:
        return JSONResponse(error_body(str(e), 400, e.param), status_code=400)

    @app.exception_handler(EngineError)
    async def engine_error(request: Request, e: EngineError) -> JSONResponse:
        return JSONResponse(error_body(f"engine: {e}", 400, code="engine_error"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(e.detail), e.status_code), status_code=e.status_code)

    add_routes(app, state)
    return app


class Guard:
    """ASGI middleware: the API key, checked before the body is read (401), and a 500 JSON error
    for anything a route did not expect (the server answers every request and keeps serving).
    Plain ASGI rather than FastAPI's `@app.middleware`, which costs a task and a stream per request."""

    def __init__(self, app: Any, key: bytes | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.key is not None and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            token = given[7:].strip() if given[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(token, self.key):
                body = error_body("missing or wrong API key (send Authorization: Bearer <key>)", 401,
                                  code="invalid_api_key")
                return await JSONResponse(body, status_code=401)(scope, receive, send)
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, tracked)
        except Exception as e:  # noqa: BLE001
            if started:  # a streamed response broke midway: nothing left to answer with
                raise
            body = error_body(f"internal error: {type(e).__name__}: {e}", 500)
            await JSONResponse(body, status_code=500)(scope, receive, send)


class ServerHandle:
    """A server running on a background thread: its `url`, its session store, `stop()`."""

    def __init__(self, server: Any, thread: threading.Thread, url: str, app: FastAPI, api_key: str | None) -> None:
        self.server, self.thread, self.url, self.app, self.api_key = server, thread, url, app, api_key

    @property
    def sessions(self) -> SessionStore:
        """The server's sessions (open one in-process with `sessions.open(...)`)."""
        return self.app.state.agentrl.sessions

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted connections inherit it
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise EngineError(f"cannot listen on {host}:{port}: {e.strerror or e} (set serve.port, 0 for a free one)") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def uvicorn_server(app: FastAPI) -> Any:
    """A uvicorn server for `app` (quiet: errors only)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="error", access_log=False, timeout_keep_alive=30, lifespan="off",
                            ws="none", log_config=None)  # log_config=None: leave the process's logging alone
    return uvicorn.Server(config)


def start_server(engine: Any, tokenizer: Any, cfg: ServeConfig | None = None, host: str | None = None,
                 port: int | None = None, *, model_name: str | None = None,
                 engine_loop: asyncio.AbstractEventLoop | None = None) -> ServerHandle:
    """Serve `engine` on a background thread (the engine then lives in that thread's loop unless
    `engine_loop` says where it does); returns once it accepts connections."""
    cfg = cfg or ServeConfig()
    app = build_app(engine, tokenizer, cfg, model_name=model_name, engine_loop=engine_loop)
    return run_app(app, cfg.host if host is None else host, cfg.port if port is None else port, cfg.api_key)


def run_app(app: FastAPI, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None) -> ServerHandle:
    """Run an ASGI `app` with uvicorn on a background thread; returns once it accepts connections."""
    sock = bind(host, port)
    server = uvicorn_server(app)

    def run() -> None:
        asyncio.run(server.serve(sockets=[sock]))

    thread = threading.Thread(target=run, name="agentrl-server", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.01)
    if not thread.is_alive():
        raise EngineError(f"the server on {host} did not start")
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return ServerHandle(server, thread, f"http://{shown}:{bound}", app, api_key)


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
    cfg = ServeConfig(host="127.0.0.1", port=0, api_key=secrets.token_urlsafe(24), max_tokens=2**24, max_n=64)
    app = build_app(None, None, cfg, model_name="agentrl-session")
    server, task, url = await serve_in_loop(app, cfg.host, 0, name="agentrl-session-server")
    return SessionHost(url, cfg.api_key, app.state.agentrl.sessions, server, task, ssl.create_default_context())


async def serve_in_loop(app: FastAPI, host: str, port: int = 0, *,
                        name: str = "agentrl-server") -> tuple[Any, asyncio.Task, str]:
    """Run `app` in the running event loop's own task (no thread: requests reach an engine living
    in this loop without crossing threads); (server, task, url) once it accepts connections."""
    sock = bind(host, port)
    server = uvicorn_server(app)
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
    shown = f"[{host}]" if ":" in host else host
    return server, task, f"http://{shown}:{sock.getsockname()[1]}"


def served_model_name(cfg_name: str | None, model_path: str | None) -> str:
    """serve.served_model_name, else the folder name of model.path, else agentrl."""
    return cfg_name or (Path(model_path).name if model_path else "agentrl")
