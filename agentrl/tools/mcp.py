"""Tools from MCP servers: `agent.args.mcp_servers` entries, connected with the official `mcp` SDK,
their tools offered to the model as our tools are.

    mcp_servers:
      - {command: [python, my_server.py], env: {KEY: value}, cwd: ., sandbox: false, name: mine}
      - {url: "http://127.0.0.1:8000/mcp"}

A `command` entry is a stdio server: a process of this one, started when the first agent that
names it is built (the warm start's, the run's, an env manager's agents share one per process),
stopped at the run's end and at the process's exit. `sandbox: true` runs it under bubblewrap: a
read-only view of the host's files, a private `/tmp`, no network, its own pid namespace, killed
with the run. A `url` entry is a streamable HTTP server that runs elsewhere.

Every session lives on one event loop, in a background thread of this module (the SDK's anyio
cancel scopes must be entered and left by the task that owns them); an agent's call is submitted
to that loop and awaited from the episode's own loop, under the agent's tool timeout. A tool's
schema is the server's `inputSchema` as `list_tools` gives it, rendered as ours; a schema that is
not an object schema refuses the run at start, in one line naming the server and the tool. A
tool whose name is one of ours or another server's refuses it too (names are not prefixed).

A server whose connection closes mid-run (its process died) is started again once; the call that
saw it die is answered with an error. When it dies again, the calls to it raise `McpServerDown`,
which fails their episodes (counted by the collector as any failed episode), never the run alone.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from agentrl.errors import AgentRLError, ConfigError, ToolError, shown
from agentrl.tools.tool import Tool, within

_T = TypeVar("_T")
KEYS = ("command", "env", "cwd", "sandbox", "name", "url")
START_TIMEOUT = 60.0  # seconds a server may take to start and list its tools
STOP_TIMEOUT = 30.0  # seconds a server may take to stop (the SDK's own escalation is bounded shorter)
# An answer longer than this is cut here already (the tool agent cuts again at
# max_tool_response_length): an OpenAI-client agent's messages stay bounded too.
MAX_ANSWER_CHARS = 65536


class McpServerDown(AgentRLError):
    """An MCP server died again after its one restart: the episodes that call it fail."""


@dataclass(frozen=True)
class ServerSpec:
    """One `mcp_servers` entry, checked: a stdio command or a streamable HTTP url."""

    name: str
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    sandbox: bool = False
    url: str | None = None


def parse_servers(value: Any) -> list[ServerSpec]:
    """The checked entries of `mcp_servers`; a ConfigError of one line names the bad field."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"mcp_servers={shown(value)} is not a list of servers ({{command: [...]}} or {{url: ...}})")
    specs = [_parse_entry(i, entry) for i, entry in enumerate(value)]
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise ConfigError(f"mcp_servers[{i}] and mcp_servers[{seen[spec.name]}] are both named {spec.name!r}; "
                              "give one a `name`")
        seen[spec.name] = i
    return specs


def _parse_entry(i: int, entry: Any) -> ServerSpec:
    where = f"mcp_servers[{i}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}={shown(entry)} is not a mapping ({{command: [...]}} or {{url: ...}})")
    unknown = [k for k in entry if k not in KEYS]
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]} is not a key of an MCP server; the keys: {', '.join(KEYS)}")
    if ("command" in entry) == ("url" in entry):
        raise ConfigError(f"{where} needs exactly one of `command` (a stdio server) or `url` (streamable HTTP)")
    name = entry.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"{where}.name={shown(name)} must be a non-empty string")
    if "url" in entry:
        url = entry["url"]
        parsed = urlparse(url) if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"{where}.url={shown(url)} must be an http:// or https:// url")
        extra = [k for k in ("env", "cwd", "sandbox") if k in entry]
        if extra:
            raise ConfigError(f"{where}.{extra[0]} applies to a stdio server (`command`), not to a url")
        return ServerSpec(name=name or parsed.netloc, url=url)
    command = entry["command"]
    if not isinstance(command, (list, tuple)) or not command or not all(isinstance(c, str) and c for c in command):
        raise ConfigError(f"{where}.command={shown(command)} must be a non-empty list of strings (the program "
                          "and its arguments)")
    env = entry.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(f"{where}.env={shown(env)} must be a mapping of strings to strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{where}.cwd={shown(cwd)} must be a folder's path")
    sandbox = entry.get("sandbox", False)
    if not isinstance(sandbox, bool):
        raise ConfigError(f"{where}.sandbox={shown(sandbox)} must be true or false")
    default = Path(command[-1]).stem or Path(command[0]).name
    return ServerSpec(name=name or default, command=tuple(command), env=tuple(sorted(env.items())),
                      cwd=str(Path(cwd).resolve()) if cwd else None, sandbox=sandbox)


def tool_schema(server: str, tool: Any) -> dict[str, Any]:
    """Our schema of an MCP tool (`{"type": "function", "function": ...}`, as the template renders
    ours); ConfigError in one line when its inputSchema is not an object schema."""
    schema = tool.input_schema
    why = None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        why = f"its type is {shown(schema.get('type') if isinstance(schema, dict) else schema)}, not 'object'"
    elif not isinstance(schema.get("properties", {}), dict) or not all(
            isinstance(p, dict) for p in schema.get("properties", {}).values()):
        why = "its properties are not a mapping of name -> schema"
    elif not isinstance(schema.get("required", []), list) or not all(
            isinstance(r, str) for r in schema.get("required", [])):
        why = "its required is not a list of names"
    if why is not None:
        raise ConfigError(f"MCP server {server!r}: tool {tool.name!r} has an inputSchema that is not a JSON object "
                          f"schema ({why}); fix the server or leave it out of agent.args.mcp_servers")
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": schema}}


def answer_text(result: Any) -> str:
    """The text of a CallToolResult: its text blocks joined (other blocks named), or its
    structured content as JSON; cut at MAX_ANSWER_CHARS."""
    parts = []
    for block in result.content or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'unknown')} content]")
    text = "\n".join(parts)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, default=str)
    if len(text) > MAX_ANSWER_CHARS:
        text = text[:MAX_ANSWER_CHARS] + "...(truncated)"
    return text


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool of an MCP server: its call goes to the server through the host loop."""

    server: McpServer | None = None

    async def run(self, arguments: dict[str, Any], timeout: float | None = None) -> str:
        """The server's answer to the call; ToolError (ToolTimeout past `timeout`) with what to tell
        the model; McpServerDown when the server died after its restart."""
        assert self.server is not None
        return str(await within(asyncio.wrap_future(_HOST.submit(self.server.call(self.name, arguments))),
                                timeout, self.name))


@dataclass
class McpServer:
    """One server's session, owned by a task of the host loop; restarted once when it dies."""

    spec: ServerSpec
    session: Any = None
    tools: list[Any] = field(default_factory=list)
    generation: int = 0
    restarts_left: int = 1
    down: str | None = None
    _stop: asyncio.Event | None = None
    _owner: asyncio.Task[None] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def start(self) -> None:
        """Connect, initialise and list the tools (within START_TIMEOUT); ConfigError saying why not."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[list[Any]] = loop.create_future()
        self._stop = asyncio.Event()
        self._owner = asyncio.create_task(self._own(ready, self._stop))
        try:
            self.tools = await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT)
        except asyncio.TimeoutError:
            await self.stop()
            raise ConfigError(f"MCP server {self.spec.name!r} did not start and list its tools within "
                              f"{START_TIMEOUT:g} s") from None
        except ConfigError:
            await self.stop()
            raise
        except Exception as e:  # noqa: BLE001 (whatever the transport raised, said in one line)
            await self.stop()
            raise ConfigError(f"MCP server {self.spec.name!r} could not start: {_line(e)}") from None
        self.generation += 1

    async def _own(self, ready: asyncio.Future[list[Any]], stop: asyncio.Event) -> None:
        """The session's whole life in one task: entered, used until `stop`, left (process stopped)."""
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                tools = await self._list(session)
                self.session = session
                ready.set_result(tools)
                await stop.wait()
        except BaseException as e:
            if not ready.done():
                leaf = _leaf(e)  # the SDK's task groups wrap what failed in exception groups
                ready.set_exception(leaf if isinstance(leaf, Exception) else RuntimeError(_line(leaf)))
            if not isinstance(e, Exception):
                raise
        finally:
            self.session = None

    async def _list(self, session: Any) -> list[Any]:
        """Every page of the server's tool listing; ConfigError in one line naming the tool whose
        entry the SDK refuses (an inputSchema that is not an object schema, typically)."""
        from mcp.types import PaginatedRequestParams
        from pydantic import ValidationError

        tools: list[Any] = []
        cursor = None
        while True:
            try:
                listed = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            except ValidationError as e:
                raise ConfigError(await self._refused(session, e, cursor)) from None
            tools += listed.tools
            cursor = listed.next_cursor
            if not cursor:
                return tools

    async def _refused(self, session: Any, error: Any, cursor: str | None) -> str:
        """One line: which tool of the listing the SDK refused, and why."""
        first = error.errors()[0]
        loc = list(first.get("loc", ()))
        name = None
        if len(loc) > 1 and loc[0] == "tools" and isinstance(loc[1], int):
            try:  # the tool's name, from the raw listing (the SDK's typed one is what failed)
                params = {"cursor": cursor} if cursor else None
                raw = await session._dispatcher.send_raw_request("tools/list", params, {})
                name = raw["tools"][loc[1]].get("name")
            except Exception:  # noqa: BLE001 (no name to give: the position says which)
                name = None
        where = ".".join(str(p) for p in loc[2:]) or "its entry"
        tool = f"tool {name!r}" if isinstance(name, str) else f"tool #{loc[1] if len(loc) > 1 else '?'}"
        what = ("an inputSchema that is not a JSON object schema" if "inputSchema" in loc
                else "an entry the MCP SDK refuses")
        return (f"MCP server {self.spec.name!r}: {tool} has {what} ({where}: {first.get('msg')}); fix the server "
                "or leave it out of agent.args.mcp_servers")

    def _transport(self) -> Any:
        spec = self.spec
        if spec.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(spec.url)
        from mcp import StdioServerParameters, stdio_client

        command = sandboxed(spec.command, spec.cwd) if spec.sandbox else list(spec.command)
        params = StdioServerParameters(command=command[0], args=command[1:], env=dict(spec.env) or None,
                                       cwd=spec.cwd)
        return stdio_client(params, errlog=_errlog())

    async def stop(self) -> None:
        """Leave the session (a stdio server's process is stopped) and wait until it is."""
        owner, self._owner = self._owner, None
        if self._stop is not None:
            self._stop.set()
        if owner is not None:
            try:
                await asyncio.wait_for(owner, STOP_TIMEOUT)
            except BaseException:  # noqa: BLE001 (a broken session is stopped all the same)
                pass
        self.session = None

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The answer of `name` to `arguments` (on the host loop)."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        session, generation = self.session, self.generation
        if session is None:
            raise McpServerDown(f"MCP server {self.spec.name!r} is down ({self.down or 'stopped'}); its episodes fail")
        try:
            result = await session.call_tool(name, arguments)
        except MCPError as e:
            if e.code != CONNECTION_CLOSED:
                raise ToolError(e.message) from None
            await asyncio.shield(self._died(generation))  # a caller's timeout does not stop a restart
            if self.session is None:
                raise McpServerDown(f"MCP server {self.spec.name!r} is down ({self.down}); its episodes fail") from None
            raise ToolError(f"the MCP server of {name} stopped during the call; it was restarted") from None
        except Exception as e:  # noqa: BLE001 (the server's or the transport's failure: the model hears it)
            raise ToolError(_line(e)) from None
        if result.is_error:
            raise ToolError(answer_text(result) or "the tool failed")
        return answer_text(result)

    async def _died(self, generation: int) -> None:
        """The session of `generation` closed: start the server again once; later, mark it down."""
        async with self._lock:
            if generation != self.generation or self.down is not None:
                return  # another call saw it first
            await self.stop()
            if self.restarts_left <= 0:
                self.down = "it died again after its restart"
                return
            self.restarts_left -= 1
            try:
                await self.start()
            except ConfigError as e:
                self.down = f"its restart failed: {e}"


class _Host:
    """The background thread and event loop that own every MCP session of this process."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.servers: dict[ServerSpec, McpServer] = {}
        self.lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> Future[_T]:
        """Run `coro` on the host loop (started on first use)."""
        with self.lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                self.thread = threading.Thread(target=self.loop.run_forever, name="agentrl-mcp", daemon=True)
                self.thread.start()
            return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def server(self, spec: ServerSpec) -> McpServer:
        """The started server of `spec`, shared by every agent of this process that names it."""
        with self.lock:
            found = self.servers.get(spec)
        if found is not None:
            return found

        async def start() -> McpServer:
            server = McpServer(spec)
            await server.start()
            return server

        server = self.submit(start()).result()
        with self.lock:
            if spec in self.servers:  # another thread started it meanwhile: one is kept
                self.submit(server.stop()).result()
                return self.servers[spec]
            self.servers[spec] = server
        return server

    def close(self, specs: list[ServerSpec] | None = None) -> None:
        """Stop every server and the loop's thread (a later use starts them again), or only the
        servers of `specs`."""
        with self.lock:
            if specs is not None:
                servers = [self.servers.pop(s) for s in specs if s in self.servers]
                loop = self.loop
                if loop is not None and servers:
                    asyncio.run_coroutine_threadsafe(_stop_all(servers), loop).result(STOP_TIMEOUT + 5)
                return
            servers, self.servers = list(self.servers.values()), {}
            loop, thread, self.loop, self.thread = self.loop, self.thread, None, None
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(_stop_all(servers), loop).result(STOP_TIMEOUT + 5)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(STOP_TIMEOUT)
            if not loop.is_running():
                loop.close()


async def _stop_all(servers: list[McpServer]) -> None:
    await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)


_HOST = _Host()
atexit.register(_HOST.close)


def close_servers(specs: list[ServerSpec] | None = None) -> None:
    """Stop every MCP server this process started (the run's end; also at the process's exit), or
    only those of `specs`."""
    _HOST.close(specs)


def mcp_tools(specs: list[ServerSpec], ours: dict[str, Tool]) -> dict[str, Tool]:
    """The tools of the `specs`' servers (started now, or shared), checked against `ours` and each
    other; ConfigError in one line for a schema or a name that cannot be used."""
    _require_sdk()
    found: dict[str, tuple[str, Tool]] = {name: ("agentrl", t) for name, t in ours.items()}
    out: dict[str, Tool] = {}
    with _HOST.lock:
        fresh = [spec for spec in specs if spec not in _HOST.servers]  # those this call starts
    try:
        for spec in specs:
            server = _HOST.server(spec)
            for listed in server.tools:
                schema = tool_schema(spec.name, listed)
                if listed.name in found:
                    owner = found[listed.name][0]
                    other = "our tool" if owner == "agentrl" else f"MCP server {owner!r}'s tool"
                    raise ConfigError(f"MCP server {spec.name!r}: tool {listed.name!r} has the name of {other} "
                                      f"{listed.name!r}; leave one of them out")
                made = McpTool(listed.name, _no_fn, schema, server=server)
                found[listed.name] = (spec.name, made)
                out[listed.name] = made
    except ConfigError:
        _HOST.close(fresh)  # refused: the servers it started do not outlive the refusal
        raise
    return out


def _no_fn(**_: Any) -> None:
    """Stands for an MCP tool's function: McpTool.run calls its server instead."""
    raise AssertionError("an MCP tool runs through its server")


def sandboxed(command: tuple[str, ...], cwd: str | None) -> list[str]:
    """`command` under bubblewrap: the host's files read-only, a private /tmp, no network, its own
    pid namespace, killed with this process; ConfigError when bubblewrap is missing."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ConfigError("an MCP server with sandbox: true needs bubblewrap (`bwrap`; Debian's package "
                          "`bubblewrap`); install it or set sandbox: false")
    folder = cwd or os.getcwd()
    cmd = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
           "--unshare-all", "--die-with-parent", "--new-session"]
    # The folder and the files the command names stay visible when they sit under the private /tmp.
    shown_paths = {folder, *(str(Path(a).resolve().parent) for a in command if Path(a).is_absolute()
                             or Path(folder, a).exists())}
    for path in sorted(p for p in shown_paths if p == "/tmp" or p.startswith("/tmp/")):
        cmd += ["--ro-bind", path, path]
    return [*cmd, "--chdir", folder, "--", *command]


def _require_sdk() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"agent.args.mcp_servers needs the 'mcp' package ({e}); install the extra: "
                          "pip install 'agentrl[mcp]'") from None


def _errlog() -> Any:
    """Where a stdio server's stderr goes: ours, when it is a real file (pytest's capture may not be)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__


def _leaf(e: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups, or `e`."""
    inner = getattr(e, "exceptions", None)  # an exception group (a builtin from 3.11 on, anyio's before)
    while isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
        e = inner[0]
        inner = getattr(e, "exceptions", None)
    return e


def _line(e: BaseException) -> str:
    """`Type: first line` of an exception (a group: its first leaf)."""
    e = _leaf(e)
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def call_in_host(fn: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run `fn()` on the host loop and wait for it (tests, and what needs a server's own loop)."""
    return _HOST.submit(fn()).result()
