"""Tools as plain functions: the `@tool` decorator, the JSON schema the chat template renders,
checking a call's arguments, and running a call (sync or async) under a timeout.

    from agentrl.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: The first number.
            b: The second number.
        \"\"\"
        return a + b

registers `add` (the function itself is returned unchanged). Its schema is what transformers'
`get_json_schema` makes of the type hints and the Google-style docstring (every parameter needs a
line under `Args:`), the format `apply_chat_template(tools=...)` takes. Keyword-only parameters
(after `*`) are the tool's settings, not the model's: they are left out of the schema and set
from the run's config (`agent.args.tool_args.<tool>.<setting>`), the defaults otherwise.

A tool answers with its return value (a string as it is; anything else as JSON). It signals a
failed call by raising: `ToolError("why")` says why to the model; any other exception is
answered with its type and message. A synchronous function runs in a thread; at its timeout the
call is abandoned but the thread cannot be stopped, so a tool that may hang should be async
(the `python` tool runs its code in a process it kills).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, overload

from agentrl.bounded_json import load_json
from agentrl.errors import AgentRLError, ConfigError, ToolError, ToolTimeout, as_failure, did_you_mean, shown
from agentrl.registry import TOOLS

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_F = TypeVar("_F", bound=Callable[..., Any])  # a tool's function, returned as it came by `@tool`
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict,
    "null": type(None)}


@dataclass(frozen=True)
class Tool:
    """A registered tool: its function, the schema the model sees, and its settings' values."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {name, description, parameters}}
    settings: dict[str, Any] = field(default_factory=dict)  # keyword-only parameters -> values
    check: Callable[[dict[str, Any]], None] | None = None  # raises ConfigError when the tool cannot run here

    def configure(self, settings: dict[str, Any], where: str) -> Tool:
        """This tool with `settings` applied (checked by name and type; `where` names the config key)."""
        if not isinstance(settings, dict):
            raise ConfigError(f"{where}={shown(settings)} is not a mapping of setting -> value")
        for key, value in settings.items():
            if key not in self.settings:
                known = ", ".join(self.settings) or "(none)"
                raise ConfigError(f"{where}.{key} is not a setting of tool '{self.name}'."
                                  f"{did_you_mean(key, self.settings)} Its settings are {known}")
            default = self.settings[key]
            if default is not None and not _same_kind(value, default):
                raise ConfigError(f"{where}.{key}={shown(value)} is not a {type(default).__name__} "
                                  f"(default {default!r})")
        return replace(self, settings={**self.settings, **settings})

    def start(self) -> None:
        """Check that the tool can run here with its settings (a ConfigError says why not); its check
        may also prepare what the calls need (an index), except within `check_only()`."""
        if self.check is not None:
            self.check(dict(self.settings))

    def argument_error(self, arguments: Any) -> str | None:
        """Why the model's `arguments` cannot be passed to the tool, or None (said to the model)."""
        if not isinstance(arguments, dict):
            return f"the arguments of {self.name} must be a JSON object, got {_kind(arguments)}"
        props = self.schema["function"]["parameters"].get("properties", {})
        unknown = [k for k in arguments if k not in props]
        if unknown:
            return f"{self.name} has no argument {unknown[0]!r}; its arguments: {', '.join(props) or '(none)'}"
        missing = [k for k in self.schema["function"]["parameters"].get("required", []) if k not in arguments]
        if missing:
            return f"{self.name} needs the argument {missing[0]!r}"
        for key, value in arguments.items():
            expected = props[key].get("type")
            if isinstance(expected, str) and not _matches(value, expected):
                return f"argument {key!r} of {self.name} must be of type {expected}, got {_kind(value)}"
        return None

    async def run(self, arguments: dict[str, Any], timeout: float | None = None) -> str:
        """The tool's answer to a call with checked `arguments`; raises ToolError (ToolTimeout
        past `timeout` seconds) with what to tell the model."""
        kwargs = {**arguments, **self.settings}
        if inspect.iscoroutinefunction(self.fn):
            call = asyncio.ensure_future(self.fn(**kwargs))
        else:  # a thread; abandoned (not stopped) at the timeout
            call = asyncio.ensure_future(asyncio.to_thread(self.fn, **kwargs))
        try:
            result = await within(call, timeout, self.name)
        except ToolError:
            raise
        except BaseException as e:  # the tool's own failure: the model hears it, the run goes on
            if not isinstance(as_failure(e), Exception):
                raise  # KeyboardInterrupt on the main thread, GeneratorExit: not the tool's to answer
            raise ToolError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
        return result if isinstance(result, str) else json.dumps(result, default=str)


async def within(call: asyncio.Future[Any], timeout: float | None, name: str) -> Any:
    """`call`'s result; ToolTimeout past `timeout` seconds, the call cancelled and awaited."""
    try:
        done, _ = await asyncio.wait({call}, timeout=timeout)
    finally:
        if not call.done():  # past its time, or the episode is stopping: the call stops too
            call.cancel()
            await asyncio.wait({call})
    if not done:
        raise ToolTimeout(f"{name} did not answer within {timeout:g} s and was stopped")
    return call.result()


# Set while the preflight (`agentrl plan`, and the start of every run) builds agents only to check
# their arguments: a tool's check then checks, and builds nothing (the plan builds nothing; the run
# builds what it needs when it builds its agents).
_CHECK_ONLY: ContextVar[bool] = ContextVar("agentrl_tools_check_only", default=False)


@contextmanager
def check_only() -> Iterator[None]:
    """Within it, tools' checks only check: they build nothing that a run would build (an index)."""
    token = _CHECK_ONLY.set(True)
    try:
        yield
    finally:
        _CHECK_ONLY.reset(token)


def checking_only() -> bool:
    """True within `check_only()`: a tool's check reads and checks, and builds nothing."""
    return _CHECK_ONLY.get()


@dataclass
class ToolUsage:
    """One episode's tool calls, counted."""

    calls: int = 0
    malformed: int = 0
    errors: int = 0
    timeouts: int = 0

    def metrics(self, success: bool) -> dict[str, float]:
        """The episode's `tools/` metrics."""
        used = self.calls > 0
        return {"tools/calls": float(self.calls), "tools/malformed": float(self.malformed),
                "tools/errors": float(self.errors), "tools/timeouts": float(self.timeouts), "tools/used": float(used),
                f"tools/success_{'with' if used else 'without'}_tool": float(success)}


async def answer_call(tools: Mapping[str, Tool], name: str, arguments: Any, timeout: float | None,
                      usage: ToolUsage) -> str:
    """The answer to one well-formed call of `name` with `arguments` (a mapping, or a JSON string
    as OpenAI clients carry them): the tool's output, or `Error: ...` saying what went wrong,
    counted in `usage` (an unknown tool or bad arguments as malformed)."""
    problem, tool = None, tools.get(name)
    if tool is None:
        problem = f"unknown tool {name!r}.{did_you_mean(name, tools)} The tools: {', '.join(tools)}"
    elif isinstance(arguments, str):  # arguments written as a JSON string
        try:
            arguments = load_json(arguments) if arguments.strip() else {}
        except ValueError as e:
            problem = f"the arguments of {name} are a string that is not JSON ({e})"
    if problem is None and tool is not None:  # `tool is not None`: always, when no problem; said for mypy
        problem = tool.argument_error(arguments)
    if problem is not None or tool is None:
        usage.malformed += 1
        return f"Error: {problem}"
    try:
        return await tool.run(arguments, timeout)
    except ToolError as e:
        usage.errors += 1
        usage.timeouts += int(isinstance(e, ToolTimeout))
        return f"Error: {e}"


@dataclass
class EpisodeTools:
    """The tools a run offers the episode being played, their timeout, and the calls counted."""

    tools: Mapping[str, Tool]
    timeout: float | None = None
    max_calls: int | None = None  # calls past it are refused (answered with an error), as the tool agent's
    usage: ToolUsage = field(default_factory=ToolUsage)


# Set by an agent around the user's code of one episode (agents/openai.py): each episode is an
# asyncio task, and a task sees the context it set, never another episode's.
EPISODE_TOOLS: ContextVar[EpisodeTools | None] = ContextVar("agentrl_episode_tools", default=None)


def offered_tools() -> dict[str, Tool]:
    """The tools the run offers the episode being played (an OpenAI-client agent's `agent.args.tools`,
    with their `tool_args`), by name; {} outside an episode or when it offers none."""
    episode = EPISODE_TOOLS.get()
    return dict(episode.tools) if episode is not None else {}


async def call_tool(name: str, arguments: Any) -> str:
    """Run the model's call of `name` (an OpenAI `tool_call`'s function name and arguments) with the
    episode's tools, as the tool agent does: the answer for the `tool` message, counted in the
    episode's `tools/` metrics."""
    episode = EPISODE_TOOLS.get()
    if episode is None:
        raise AgentRLError("call_tool runs a call inside an episode of an agentrl run (agent.type=openai with "
                           "agent.args.tools); outside one, run the Tool itself: `await tool.run(arguments)`")
    usage = episode.usage
    usage.calls += 1
    if episode.max_calls is not None and usage.calls > episode.max_calls:
        usage.errors += 1
        return f"Error: no tool calls left in this episode (at most {episode.max_calls}); answer without tools"
    return await answer_call(episode.tools, name, arguments, episode.timeout, usage)


@overload
def tool(fn: _F, *, name: str | None = None, check: Callable[[dict[str, Any]], None] | None = None,
         overwrite: bool = False) -> _F: ...


@overload
def tool(fn: None = None, *, name: str | None = None, check: Callable[[dict[str, Any]], None] | None = None,
         overwrite: bool = False) -> Callable[[_F], _F]: ...


def tool(fn: _F | None = None, *, name: str | None = None, check: Callable[[dict[str, Any]], None] | None = None,
         overwrite: bool = False) -> _F | Callable[[_F], _F]:
    """Register `fn` as a tool (usable as `@tool` or `@tool(name=..., check=...)`) and return it
    unchanged; `check(settings)` raises a ConfigError when the tool cannot run here."""
    def register(f: _F) -> _F:
        key = name or f.__name__
        if key not in TOOLS or TOOLS.get(key).fn is not f:  # the same function decorated again is one tool
            TOOLS.register(key, make_tool(f, name=name, check=check), overwrite=overwrite)
        return f

    return register if fn is None else register(fn)


def make_tool(fn: Callable[..., Any], name: str | None = None,
              check: Callable[[dict[str, Any]], None] | None = None) -> Tool:
    """The Tool of a function: its schema from the type hints and docstring (transformers'
    `get_json_schema`), its keyword-only parameters as settings."""
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    name = name or fn.__name__
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"tool name {name!r} must be letters, digits, '_' or '-', not starting with a digit")
    params = inspect.signature(fn).parameters.values()
    odd = [p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY)]
    if odd:
        raise ConfigError(f"tool {name}: parameter {odd[0]!r} cannot be given by name; the model passes arguments "
                          "by name (plain parameters), settings are keyword-only (after `*`)")
    settings = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
    missing = [k for k, v in settings.items() if v is inspect.Parameter.empty]
    if missing:
        raise ConfigError(f"tool {name}: setting {missing[0]!r} (keyword-only) needs a default")
    try:
        schema = get_json_schema(fn)
    except (DocstringParsingException, TypeHintParsingException) as e:
        raise ConfigError(f"tool {name}: {e} (write a docstring with an `Args:` line per parameter, and type "
                          "hints)") from None
    function = schema["function"]
    function["name"] = name
    parameters = function.setdefault("parameters", {"type": "object", "properties": {}})
    for key in settings:  # settings are the run's, not the model's
        parameters.get("properties", {}).pop(key, None)
    if "required" in parameters:
        parameters["required"] = [k for k in parameters["required"] if k not in settings]
    function.pop("return", None)  # what it returns is text to the model either way
    return Tool(name, fn, schema, settings, check)


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def _matches(value: Any, expected: str) -> bool:
    kind = _JSON_TYPES.get(expected)
    if kind is None:
        return True  # a type this check does not know: the tool judges
    if expected in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, kind)


def _kind(value: Any) -> str:
    for name, kind in _JSON_TYPES.items():
        if isinstance(value, kind) and not (name in ("integer", "number") and isinstance(value, bool)):
            return name
    return type(value).__name__
