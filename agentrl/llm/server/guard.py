"""What a request must show before a route of the server runs, and how long it may take.

- **Keys.** Every route but /health takes `serve.api_key` when one is set. The control routes
  (`ADMIN_ROUTES`: weights, state, prefix cache, metrics), which change what the server serves,
  always take a key: `serve.api_key`, or when none is set the admin key made at start-up
  (`agentrl serve` prints it and writes it to its run folder). Loopback is no boundary: any
  process of the machine, and any web page its browser shows, can reach 127.0.0.1.
- **No web pages, no guessed bodies.** A control request with an `Origin` header (a browser's)
  is refused, and so is one whose Content-Type is not the route's (`application/json`, or
  `application/octet-stream` for a weights body; none for the two routes that read no body): a
  page can send `text/plain` across origins without asking, never these.
- **Bodies are counted as they stream in** (`read_body`): a body over its cap is refused before
  it is held. A refused request's body is read and dropped up to `DRAIN_BYTES` first, so a
  client still sending can read the answer (a server that closes with unread data makes the
  kernel reset the connection, and the client sees only that); past it the connection closes.
- **Silence is bounded** (serve.idle_timeout): a client waits that long at most between two
  pieces of a body (`read_body`), and `TimedH11Protocol` closes a connection that has not sent a
  whole request head within it, or that keeps sending after its answer.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentrl.llm.server.openai_format import error_body
from agentrl.llm.server.openai_schema import RequestError

OPEN_PATHS = ("/health",)  # answered without any key (load balancers, readiness probes)
JSON, BINARY = "application/json", "application/octet-stream"
ADMIN_ROUTES = {  # the routes that change the server -> the Content-Types their body may have ("": none)
    "/agentrl/weights": (JSON, BINARY),
    "/agentrl/state": (JSON,),
    "/agentrl/reset_prefix_cache": (JSON, ""),  # these two read no body
    "/agentrl/metrics": (JSON, ""),
}
DRAIN_BYTES = 64 * 2**20  # a refused body is read and dropped up to this, so its client can read why


def bearer(headers: dict[bytes, bytes]) -> bytes:
    """The token of an `Authorization: Bearer <token>` header (empty without one)."""
    given = headers.get(b"authorization", b"")
    return given[7:].strip() if given[:7].lower() == b"bearer " else b""


def media_type(headers: dict[bytes, bytes]) -> str:
    """The request's Content-Type without its parameters, lower case ('' when it has none)."""
    return headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")


class Guard:
    """ASGI middleware: keys, origin and content type, checked before a body is read, and a 500
    JSON error for anything a route did not expect (the server answers every request and keeps
    serving). Plain ASGI rather than FastAPI's `@app.middleware`, which costs a task and a stream
    per request."""

    def __init__(self, app: Any, key: str | None, admin_key: str, idle_timeout: float) -> None:
        self.app, self.idle_timeout = app, idle_timeout
        self.key = key.encode() if key is not None else None
        self.admin_key = admin_key.encode()

    def refusal(self, scope: dict) -> tuple[int, str, str] | None:
        """(status, message, code) when the request may not reach its route, else None."""
        path = scope["path"]
        if path in OPEN_PATHS:
            return None
        headers = dict(scope["headers"])
        allowed = ADMIN_ROUTES.get(path)
        if allowed is None:
            if self.key is not None and not hmac.compare_digest(bearer(headers), self.key):
                return 401, "missing or wrong API key (send Authorization: Bearer <key>)", "invalid_api_key"
            return None
        if b"origin" in headers:
            return 403, f"{path} changes the server and refuses requests from web pages (an Origin header)", \
                "origin_refused"
        if not hmac.compare_digest(bearer(headers), self.admin_key):
            return 401, (f"{path} changes the server and needs its admin key (Authorization: Bearer <key>): "
                         "serve.api_key, or without one the key `agentrl serve` printed at start and wrote "
                         "to RUN_DIR/serve-PORT.key (engine.api_key_file)"), "invalid_admin_key"
        kind = media_type(headers)
        if kind not in allowed:
            return 415, f"{path} takes Content-Type {' or '.join(t for t in allowed if t)}, not {kind or 'none'}", \
                "unsupported_media_type"
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = self.refusal(scope)
        if refused is not None:
            status, message, code = refused
            ended = await drain(scope, receive, self.idle_timeout)
            return await JSONResponse(error_body(message, status, code=code), status_code=status,
                                      headers=None if ended else {"connection": "close"})(scope, receive, send)
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


async def _next(receive: Any, timeout: float) -> dict:
    """The next ASGI message of a request, or a 408 after `timeout` seconds of silence."""
    try:
        return await asyncio.wait_for(receive(), timeout)
    except asyncio.TimeoutError:
        raise RequestError(408, f"the request body stopped arriving for {timeout:g} s (serve.idle_timeout)",
                           close=True) from None


async def drain(scope: dict, receive: Any, timeout: float, seen: int = 0) -> bool:
    """Read and drop the rest of a request's body, up to DRAIN_BYTES in all (`seen` were read);
    True when it ended, so the connection can serve the next request."""
    declared = dict(scope["headers"]).get(b"content-length", b"")
    if declared and (not declared.isdigit() or int(declared) > DRAIN_BYTES):
        return False  # it will not end within the bound: answer at once
    while seen <= DRAIN_BYTES:
        try:
            message = await _next(receive, timeout)
        except RequestError:
            return False
        if message["type"] != "http.request":
            return False  # the client left
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


async def read_body(request: Request, limit: int, timeout: float, cap: str = "serve.max_request_bytes") -> bytes:
    """The request body, counted as it streams in: 413 once it passes `limit` bytes (`cap` says
    what sets it; what follows is dropped first, up to DRAIN_BYTES), 408 when it stops arriving
    for `timeout` s."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise RequestError(400, "Content-Length must be a number of bytes", close=True)
        if int(declared) > limit:
            ended = await drain(request.scope, request.receive, timeout)
            raise RequestError(413, f"the request body of {declared} bytes exceeds this server's limit of {limit} "
                                    f"({cap})", close=not ended)
    body = bytearray()
    while True:
        message = await _next(request.receive, timeout)
        if message["type"] != "http.request":
            raise RequestError(400, "the client closed the connection before its body ended", close=True)
        body += message.get("body", b"")
        if len(body) > limit:
            ended = await drain(request.scope, request.receive, timeout, len(body))
            raise RequestError(413, f"the request body exceeds this server's limit of {limit} bytes ({cap})",
                               close=not ended)
        if not message.get("more_body", False):
            return bytes(body)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline whenever the server waits on the client with no
    request in the app's hands: a new connection's first request head, the next request's, or the
    rest of a body sent after the answer must arrive within `timeout_keep_alive` seconds in all,
    not per byte. (uvicorn alone waits forever for a head begun and for a new connection's first
    byte, so a client could hold connections open without ever finishing a request.)"""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def handle_events(self) -> None:
        super().handle_events()
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def _watch(self) -> None:
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and self._deadline is None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.timeout_keep_alive, self._expire)
        elif not waiting and self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()
