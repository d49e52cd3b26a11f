"""The one parser of `<tool_call>` blocks: well-formed calls, and every malformed one with its reason."""

import pytest

from agentrl.llm.server.chat_messages import parse_reply
from agentrl.llm.tool_calls import call_text, parse_tool_calls


def test_well_formed_calls_keep_their_order_names_and_arguments():
    text = ('Let me compute.<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
            '<tool_call>{"name":"search","parameters":{"q":"x"}}</tool_call>')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.ok) for c in calls] == [("python", {"code": "print(1)"}, True),
                                                             ("search", {"q": "x"}, True)]
    assert calls[0].start == text.index("<tool_call>")
    assert parse_tool_calls(call_text("python", {"code": "1"}))[0].arguments == {"code": "1"}


def test_malformed_blocks_are_returned_with_what_is_wrong():
    calls = parse_tool_calls('<tool_call>{"name": python}</tool_call><tool_call>[1]</tool_call>'
                             '<tool_call>{"name": "python", "arguments": {}}')
    assert [c.ok for c in calls] == [False, False, False]
    assert "not valid JSON" in calls[0].error
    assert 'string "name"' in calls[1].error
    assert "not closed" in calls[2].error
    assert parse_tool_calls("no call here <answer>3</answer>") == []


def test_the_server_hands_only_well_formed_calls_to_the_client():
    text = 'Hm.<tool_call>{bad}</tool_call> then <tool_call>{"name": "move", "arguments": {"d": 1}}</tool_call>'
    content, calls = parse_reply(text, tools=True)
    assert content == "Hm.<tool_call>{bad}</tool_call> then"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("move", '{"d": 1}')]
    assert parse_reply(text, tools=False) == (text, [])
    assert parse_reply("<tool_call>{bad}</tool_call>", tools=True) == ("<tool_call>{bad}</tool_call>", [])


def test_a_call_nesting_a_thousand_deep_is_malformed_not_a_recursion_error():
    deep = "[" * 1000 + "]" * 1000
    text = f'<tool_call>{{"name": "python", "arguments": {{"code": {deep}}}}}</tool_call>'
    calls = parse_tool_calls(text)  # was RecursionError: the episode failed, the server answered 500
    assert len(calls) == 1 and not calls[0].ok
    assert calls[0].error == "the tool call is not valid JSON (arrays and objects nest deeper than 64 levels)"
    assert parse_reply(text, tools=True) == (text, [])  # the server: a malformed block stays text
    nested = "[" * 62 + "]" * 62  # 64 levels with the call and its arguments (the bound); brackets in strings: none
    ok = parse_tool_calls(f'<tool_call>{{"name": "f", "arguments": {{"a": {nested}, "b": "[[[[{{\\"]]"}}}}</tool_call>')
    assert ok[0].ok and ok[0].arguments["b"] == '[[[[{"]]'


def test_arguments_written_as_a_string_nesting_a_thousand_deep_are_refused_in_one_answer():
    import asyncio

    from agentrl.llm.server.chat_messages import MessageError, normalize_messages
    from agentrl.tools import make_tool
    from agentrl.tools.tool import ToolUsage, answer_call

    def echo(x: list) -> str:
        """Echo.

        Args:
            x: Anything.
        """
        return "ran"

    deep = '{"x": ' + "[" * 1000 + "]" * 1000 + "}"
    usage = ToolUsage()
    answer = asyncio.run(answer_call({"echo": make_tool(echo)}, "echo", deep, None, usage))
    assert answer == ("Error: the arguments of echo are a string that is not JSON (arrays and objects nest deeper "
                      "than 64 levels)") and usage.malformed == 1
    # a client's message carrying such arguments: a 400 naming the field, not a 500
    message = {"role": "assistant", "content": None,
               "tool_calls": [{"id": "c", "type": "function", "function": {"name": "echo", "arguments": deep}}]}
    with pytest.raises(MessageError, match=r"tool_calls\[0\].function.arguments is not valid JSON \(arrays"):
        normalize_messages([message])


def test_parsing_is_one_scan_however_many_openings_are_never_closed():
    # 4,000 unclosed openings took 7.9 s (a regex retried at every opening: quadratic); 100,000 would
    # take over an hour that way, and take milliseconds in one left-to-right scan.
    text = "I will call <tool_call>" + "<tool_call>" * 100_000 + "  " * 100_000
    calls = parse_tool_calls(text)
    assert [(c.error, c.start, c.end) for c in calls] == [
        ("<tool_call> is not closed with </tool_call>", len("I will call "), len(text))]
    many = "".join(f'<tool_call>{{"name": "f", "arguments": {{"k": {k}}}}}</tool_call> ' for k in range(10_000))
    assert [c.arguments["k"] for c in parse_tool_calls(many)] == list(range(10_000))
