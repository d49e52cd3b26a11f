"""The one parser of `<tool_call>` blocks: well-formed calls, and every malformed one with its reason."""

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
