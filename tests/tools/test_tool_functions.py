"""Tools as plain functions: `@tool` registers a function (sync or async) with the schema transformers
makes of it, settings stay out of the model's view, calls are checked and run under a timeout."""

import asyncio
import threading

import pytest
from transformers.utils import get_json_schema

from agentrl.errors import ConfigError, RegistryError
from agentrl.registry import TOOLS
from agentrl.tools import ToolError, ToolTimeout, make_tool, tool


def multiply(a: int, b: int, *, scale: int = 1) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
        scale: A setting of the run, not of the model.
    """
    return a * b * scale


async def lookup(key: str, default: str | None = None) -> dict:
    """Look a key up.

    Args:
        key: What to look up.
        default: What to answer when the key is unknown.
    """
    return {"key": key, "value": default}


def test_the_decorator_registers_the_function_unchanged_with_transformers_schema():
    returned = tool(name="test_multiply")(multiply)
    assert returned is multiply and multiply(2, 3) == 6  # still a plain function
    t = TOOLS.get("test_multiply")
    expected = get_json_schema(multiply)["function"]
    assert t.schema["type"] == "function" and t.schema["function"]["name"] == "test_multiply"
    assert t.schema["function"]["description"] == expected["description"] == "Multiply two integers."
    assert t.schema["function"]["parameters"]["properties"] == {k: v for k, v in expected["parameters"]["properties"].items()
                                                                if k != "scale"}
    assert t.schema["function"]["parameters"]["required"] == ["a", "b"]
    assert t.settings == {"scale": 1}
    tool(name="test_multiply")(multiply)  # the same function again: the same tool
    with pytest.raises(RegistryError, match="already registered"):
        tool(name="test_multiply")(lookup)


def test_sync_and_async_tools_answer_as_text_with_settings_applied():
    t = make_tool(multiply).configure({"scale": 10}, "tool_args.multiply")
    assert asyncio.run(t.run({"a": 2, "b": 3})) == "60"
    assert asyncio.run(make_tool(lookup).run({"key": "k"})) == '{"key": "k", "value": null}'


def test_arguments_are_checked_against_the_schema():
    t = make_tool(multiply)
    assert t.argument_error({"a": 1, "b": 2}) is None
    assert "must be a JSON object" in t.argument_error([1, 2])
    assert "has no argument 'c'" in t.argument_error({"a": 1, "b": 2, "c": 3})
    assert "has no argument 'scale'" in t.argument_error({"a": 1, "b": 2, "scale": 3})  # a setting is not the model's
    assert "needs the argument 'b'" in t.argument_error({"a": 1})
    assert "must be of type integer, got string" in t.argument_error({"a": "1", "b": 2})
    assert "must be of type integer, got boolean" in t.argument_error({"a": True, "b": 2})


def test_a_failing_tool_answers_with_its_error_and_a_slow_one_times_out():
    def broken(x: int) -> str:
        """Fail.

        Args:
            x: Anything.
        """
        raise KeyError(x)

    async def slow(x: int) -> str:
        """Never answer.

        Args:
            x: Anything.
        """
        await asyncio.sleep(3600)

    release = threading.Event()

    def blocking(x: int) -> str:
        """Block a thread.

        Args:
            x: Anything.
        """
        release.wait()
        return "late"

    with pytest.raises(ToolError, match="KeyError: 3"):
        asyncio.run(make_tool(broken).run({"x": 3}))
    with pytest.raises(ToolTimeout, match="slow did not answer within 0.05 s"):
        asyncio.run(make_tool(slow).run({"x": 1}, timeout=0.05))
    loop = asyncio.new_event_loop()  # asyncio.run would wait for the abandoned thread before returning
    try:
        with pytest.raises(ToolTimeout, match="blocking did not answer"):
            loop.run_until_complete(make_tool(blocking).run({"x": 1}, timeout=0.05))
    finally:
        release.set()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def test_bad_tool_definitions_and_settings_fail_in_one_line():
    def undocumented(x: int) -> str:
        """No Args section."""

    with pytest.raises(ConfigError, match="no description for the argument 'x'.*Args:") as e:
        make_tool(undocumented)
    assert "\n" not in str(e.value)

    def varargs(*xs: int) -> str:
        """Many.

        Args:
            xs: Numbers.
        """

    with pytest.raises(ConfigError, match="parameter 'xs' cannot be given by name"):
        make_tool(varargs)
    t = make_tool(multiply)
    with pytest.raises(ConfigError, match=r"tool_args.multiply.scal is not a setting of tool 'multiply'. Did you mean "
                                          r"'scale'\? Its settings are scale"):
        t.configure({"scal": 2}, "tool_args.multiply")
    with pytest.raises(ConfigError, match=r"tool_args.multiply.scale='2' is not a int \(default 1\)"):
        t.configure({"scale": "2"}, "tool_args.multiply")
