"""Talking to an OpenEnv server: what it serves (checked once per process) and one session per episode.

`server_info(url, timeout)` reads `/schema` and `/metadata` with httpx and finds whether the server
holds sessions (a WebSocket at `/ws`); it is what `agentrl plan` checks, so an unreachable URL, a
server that is not OpenEnv's or one that does not answer within the timeout is one ConfigError line.

A session is one episode. Over WebSocket it is openenv-core's own async client (`GenericEnvClient`:
one `/ws` connection, hence one environment instance on the server, per episode). A server without
`/ws` is driven over HTTP (`POST /reset`, `POST /step`, with httpx): such a server keeps one
episode's state for everyone, so its episodes in this process take turns. Sessions to one server
are at most `sessions` at a time per event loop (openenv-core servers refuse a WebSocket beyond
their `max_concurrent_envs`, which its routes do not publish).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import weakref
from dataclasses import dataclass
from typing import Any

from agentrl.envs.args import import_extra
from agentrl.errors import ConfigError, EnvError

_INFO: dict[tuple[str, float, str], ServerInfo] = {}  # (url, timeout, transport) -> what it serves
# {event loop: {(url, sessions): semaphore}}: asyncio's primitives belong to one loop.
_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], asyncio.Semaphore]] = \
    weakref.WeakKeyDictionary()
CLOSE_WHEN_ENDING = 1.0  # seconds a session's close may take while its event loop is ending
_CODE = re.compile(r"\(code: ([A-Z_]+)\)\s*$")


def import_openenv() -> Any:
    """openenv-core's package (`openenv`), imported on first use."""
    return import_extra("openenv", "openenv", "env type 'openenv'")


@dataclass(frozen=True)
class ServerInfo:
    """What a server serves: its action and observation schemas, name, description and transport."""

    url: str
    action_schema: dict[str, Any]
    observation_schema: dict[str, Any]
    name: str
    description: str
    transport: str  # "websocket" or "http"


def server_info(url: str, timeout: float, transport: str = "auto") -> ServerInfo:
    """The server's schemas and metadata (cached per process); a ConfigError line when it cannot be read."""
    key = (url, timeout, transport)
    if key not in _INFO:
        _INFO[key] = _read_info(url, timeout, transport)
    return _INFO[key]


def _read_info(url: str, timeout: float, transport: str) -> ServerInfo:
    import httpx

    where = f"openenv: url={url!r}"
    try:
        with httpx.Client(base_url=url, timeout=timeout, trust_env=False) as client:
            schema = client.get("/schema")
            metadata = client.get("/metadata")
    except httpx.TimeoutException:
        raise ConfigError(f"{where}: the server did not answer GET /schema within {timeout:g} s "
                          "(env.args.timeout)") from None
    except httpx.HTTPError as e:
        raise ConfigError(f"{where}: no server answers ({type(e).__name__}: {_first_line(e)}); start the "
                          "OpenEnv server, or give env.args.app=module:app for agentrl to serve it") from None
    if schema.status_code != 200:
        raise ConfigError(f"{where} is not an OpenEnv server: GET /schema answered {schema.status_code}")
    try:
        body = schema.json()
        action, observation = body["action"], body["observation"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{where} is not an OpenEnv server: GET /schema has no action and observation "
                          "schemas") from None
    meta = _json_or_empty(metadata) if metadata.status_code == 200 else {}
    if transport == "auto":
        transport = "websocket" if has_websocket(url, timeout) else "http"
    return ServerInfo(url=url, action_schema=action, observation_schema=observation,
                      name=str(meta.get("name") or "OpenEnv"), description=str(meta.get("description") or ""),
                      transport=transport)


def _json_or_empty(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def has_websocket(url: str, timeout: float) -> bool:
    """Whether the server accepts a session at `/ws` (opened and closed at once)."""
    from openenv.core.utils import convert_to_ws_url  # type: ignore[import-untyped]
    from websockets.exceptions import ConnectionClosed, WebSocketException
    from websockets.sync.client import connect

    try:
        with connect(f"{convert_to_ws_url(url)}/ws", open_timeout=timeout, close_timeout=timeout) as ws:
            ws.send('{"type": "close"}')
            try:  # the server closes first (openenv-core's server logs an error when the client does)
                ws.recv(timeout=timeout)
            except ConnectionClosed:
                pass
        return True
    except (OSError, TimeoutError, WebSocketException):
        return False


@functools.cache
def _client_class() -> type:
    """openenv-core's GenericEnvClient, closing as its server expects: the session's close message
    sent, then the server's close awaited (its client closes its own end first, on which openenv-core
    0.3's server logs an exception for every session)."""
    from openenv.core.generic_client import GenericEnvClient  # type: ignore[import-untyped]

    class Client(GenericEnvClient):
        _ws: Any  # the connection (openenv-core's attribute), None when closed

        async def disconnect(self) -> None:
            """Send the close message and wait for the server to close the connection."""
            if self._ws is None:
                return
            try:
                await self._close_handshake(self._message_timeout)
            except asyncio.CancelledError:
                # asyncio.run cancels what is left when a collection ends, an episode's close among them:
                # the handshake is finished all the same, briefly, then the cancel goes on.
                await self._close_handshake(min(self._message_timeout, CLOSE_WHEN_ENDING))
                raise
            finally:
                self._ws = None

        async def _close_handshake(self, bound: float) -> None:
            ws: Any = self._ws
            try:
                if ws.state.name == "OPEN":
                    await ws.send(json.dumps({"type": "close"}))
                await asyncio.wait_for(ws.wait_closed(), bound)
            except Exception:  # noqa: BLE001 (closing is best effort, as the client's own disconnect)
                pass
            finally:
                try:  # a server stuck in a step answers no close frame: the wait is bounded too
                    await asyncio.wait_for(ws.close(), bound)
                except Exception:  # noqa: BLE001
                    ws.transport.abort()

    return Client


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def gate(url: str, sessions: int) -> asyncio.Semaphore:
    """The running loop's semaphore of sessions to `url`."""
    gates = _GATES.setdefault(asyncio.get_running_loop(), {})
    return gates.setdefault((url, sessions), asyncio.Semaphore(sessions))


class Refused(Exception):
    """The server refused the action as invalid (its schema's validation): an invalid action, not a failure."""


class Session:
    """One episode's session: `reset(seed)` and `step(fields)` give OpenEnv's `{observation, reward, done}`."""

    def __init__(self, info: ServerInfo, timeout: float) -> None:
        self.info, self.timeout = info, timeout
        self._ws: Any = None
        self._http: Any = None

    async def reset(self, seed: int | None) -> dict[str, Any]:
        """Open the session and reset it with `seed`."""
        data = {} if seed is None else {"seed": seed}
        if self.info.transport == "websocket":
            self._ws = _client_class()(base_url=self.info.url, connect_timeout_s=self.timeout,
                                        message_timeout_s=self.timeout)
            return await self._call("reset", self._ws.reset(**data))
        import httpx

        # No TLS context for plain http (httpx loads the CA bundle per client otherwise: 40 ms an episode).
        self._http = httpx.AsyncClient(base_url=self.info.url, timeout=self.timeout, trust_env=False,
                                       verify=self.info.url.startswith("https://"))
        return await self._call("reset", self._post("/reset", data))

    async def step(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Send the action's fields."""
        if self._ws is not None:
            return await self._call("step", self._ws.step(fields))
        return await self._call("step", self._post("/step", {"action": fields}))

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = await self._http.post(path, json=body)
        if response.status_code == 422 and path == "/step":
            raise Refused(_first_line(Exception(response.text)))
        if response.status_code != 200:
            raise EnvError(f"openenv: the server at {self.info.url} answered POST {path} with "
                           f"{response.status_code}: {' '.join(response.text.split())[:200]}")
        return response.json()

    async def _call(self, what: str, request: Any) -> dict[str, Any]:
        """The server's answer as a dict; its errors and silences as one-line EnvErrors."""
        import httpx

        try:
            result = await request
        except (asyncio.TimeoutError, httpx.TimeoutException):
            raise EnvError(f"openenv: the server at {self.info.url} did not answer {what} within {self.timeout:g} s "
                           "(env.args.timeout)") from None
        except (Refused, EnvError):
            raise
        except RuntimeError as e:  # the client's "Server error: <message> (code: <CODE>)"
            code = _CODE.search(str(e))
            if code and code.group(1) == "VALIDATION_ERROR" and what == "step":
                raise Refused(str(e)) from None
            hint = (" (more sessions than the server allows: lower env.args.sessions)"
                    if code and code.group(1) == "CAPACITY_REACHED" else "")
            raise EnvError(f"openenv: {what} failed on the server at {self.info.url}: "
                           f"{' '.join(str(e).split())[:300]}{hint}") from None
        except (ConnectionError, OSError, httpx.HTTPError) as e:
            raise EnvError(f"openenv: lost the server at {self.info.url} during {what}: {type(e).__name__}: "
                           f"{_first_line(e)}") from None
        if hasattr(result, "observation"):  # openenv's StepResult
            return {"observation": result.observation, "reward": result.reward, "done": result.done}
        if not isinstance(result, dict):
            raise EnvError(f"openenv: {what} on the server at {self.info.url} answered {type(result).__name__}, "
                           "not a JSON object")
        return result

    async def aclose(self) -> None:
        """End the session (the server drops its environment instance)."""
        ws, http, self._ws, self._http = self._ws, self._http, None, None
        if ws is not None:
            await ws.close()
        if http is not None:
            await http.aclose()
