"""What a request must show before a route of the server runs, and how long it may take.

- **Keys.** Every route but /health takes `serve.api_key` when one is set. The control routes
  (`ADMIN_ROUTES`: weights, adapter, state, prefix cache, metrics), which change what the server serves,
  always take a key: `serve.api_key`, or when none is set the admin key made at start-up
  (`agentrl serve` writes it to its run folder and prints where). Loopback is no boundary: any
  process of the machine, and any web page its browser shows, can reach 127.0.0.1.
- **Only this server's names** (`AllowedHosts`). Every route answers only a `Host` of the
  loopback names (localhost, 127.0.0.1, [::1]), the address the server bound (any IP literal
  when it bound a wildcard: 0.0.0.0, ::) or serve.allowed_hosts, with any port: a web page whose
  name an attacker re-points at this machine (DNS rebinding) sends its own name, and is refused.
- **No web pages, no guessed bodies.** A request with an `Origin` header (a browser's) is
  refused unless that origin's host is one of the above; a control request with any `Origin` is
  refused. A request whose Content-Type is not the route's is refused on every route
  (`application/json` for a POST, or `application/octet-stream` for a weights body; none also
  for the routes that read no body): a page can send `text/plain` across origins without
  asking, never these.
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
import ipaddress
from collections.abc import Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentrl.llm.server.openai_format import error_body
from agentrl.llm.server.openai_schema import RequestError

OPEN_PATHS = ("/health",)  # answered without any key (load balancers, readiness probes)
JSON, BINARY = "application/json", "application/octet-stream"
ADMIN_ROUTES = {  # the routes that change the server -> the Content-Types their body may have ("": none)
    "/agentrl/weights": (JSON, BINARY),
    "/agentrl/adapter": (JSON, BINARY),
    "/agentrl/state": (JSON,),
    "/agentrl/reset_prefix_cache": (JSON, ""),  # these two read no body
    "/agentrl/metrics": (JSON, ""),
}
NO_BODY_ROUTES = {"/sessions": (JSON, "")}  # POST routes that read no body: none is a Content-Type too
DRAIN_BYTES = 64 * 2**20  # a refused body is read and dropped up to this, so its client can read why
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"  # in serve.allowed_hosts: every Host (a proxy in front checks them)


def host_name(value: str) -> str | None:
    """The host of a Host header or of an origin's authority (`name`, `name:port`, `[v6]:port`):
    lower case, without port, brackets or trailing dot; None when it is not one."""
    try:
        parts = urlsplit("//" + value.strip())
        _ = parts.port  # raises on a port that is not one (99999, abc)
    except ValueError:
        return None
    name = (parts.hostname or "").rstrip(".")
    if not name or parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return name


class AllowedHosts:
    """The hosts a request's `Host` (and a browser's `Origin`) may name: the loopback names,
    the address the server bound and serve.host as written, serve.allowed_hosts; any IP literal
    once a wildcard address (0.0.0.0, ::) is bound; anything with "*" in serve.allowed_hosts."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        extra = list(extra)
        self.names = set(LOOPBACK_NAMES)
        self.any_name = ANY_HOST in extra
        self.any_ip = False
        self._add(*(e for e in extra if e != ANY_HOST))

    def _add(self, *hosts: str | None) -> None:
        for value in hosts:
            bare = value and ":" in value and not value.startswith("[")  # an IPv6 address without brackets
            name = host_name(f"[{value}]" if bare else value or "")
            if name:
                self.names.add(name)

    def bound(self, address: str, host: str | None = None) -> None:
        """The server listens on `address` (the socket's), as `host` was written."""
        self._add(address, host)
        try:
            self.any_ip = self.any_ip or ipaddress.ip_address(address).is_unspecified
        except ValueError:
            pass

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if self.any_name or name in self.names:
            return True
        if self.any_ip:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                return False
            return True
        return False


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

    def __init__(self, app: Any, key: str | None, admin_key: str, idle_timeout: float,
                 hosts: AllowedHosts | None = None) -> None:
        self.app, self.idle_timeout = app, idle_timeout
        self.key = key.encode() if key is not None else None
        self.admin_key = admin_key.encode()
        self.hosts = hosts if hosts is not None else AllowedHosts()

    def refusal(self, scope: dict) -> tuple[int, str, str] | None:
        """(status, message, code) when the request may not reach its route, else None."""
        path = scope["path"]
        headers = dict(scope["headers"])
        wrong = self.foreign(headers)
        if wrong is not None:
            return wrong
        if path in OPEN_PATHS:
            return None
        allowed = ADMIN_ROUTES.get(path)
        if allowed is None:
            if self.key is not None and not hmac.compare_digest(bearer(headers), self.key):
                return 401, "missing or wrong API key (send Authorization: Bearer <key>)", "invalid_api_key"
            if scope.get("method") != "POST":
                return None  # no body is read
            allowed = NO_BODY_ROUTES.get(path, (JSON,))
            kind = media_type(headers)
            if kind not in allowed:
                return 415, f"{path} takes Content-Type {' or '.join(t for t in allowed if t)}, not {kind or 'none'}", \
                    "unsupported_media_type"
            return None
        if b"origin" in headers:
            return 403, f"{path} changes the server and refuses requests from web pages (an Origin header)", \
                "origin_refused"
        if not hmac.compare_digest(bearer(headers), self.admin_key):
            return 401, (f"{path} changes the server and needs its admin key (Authorization: Bearer <key>): "
                         "serve.api_key, or without one the key `agentrl serve` wrote to RUN_DIR/serve-PORT.key "
                         "(engine.api_key_file)"), "invalid_admin_key"
        kind = media_type(headers)
        if kind not in allowed:
            return 415, f"{path} takes Content-Type {' or '.join(t for t in allowed if t)}, not {kind or 'none'}", \
                "unsupported_media_type"
        return None

    def foreign(self, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        """A refusal when the request names a host this server is not (`Host`), or comes from a web
        page of another one (`Origin`); None otherwise. No Host at all (HTTP/1.0) names none."""
        if b"host" in headers:
            value = headers[b"host"].decode("latin-1")
            if host_name(value) not in self.hosts:
                return 400, (f"Host {value[:100]!r} is not a name of this server (the loopback names, the address "
                             "it bound, or serve.allowed_hosts)"), "host_refused"
        if b"origin" in headers:
            origin = headers[b"origin"].decode("latin-1")
            parts = urlsplit(origin.strip())
            if parts.scheme not in ("http", "https") or host_name(parts.netloc) not in self.hosts:
                return 403, (f"requests from web pages of other hosts are refused (Origin {origin[:100]!r}; "
                             "serve.allowed_hosts names the hosts this server answers to)"), "origin_refused"
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
        except Exception as e:  # noqa: BLE001 (any error of the app is answered as a JSON 500 while it still can be)
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


async def drain(scope: MutableMapping[str, Any], receive: Any, timeout: float, seen: int = 0) -> bool:
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

    def connection_made(self, transport: Any) -> None:
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
