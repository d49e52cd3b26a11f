"""Tool calls in the model's own text: Qwen's / Hermes' `<tool_call>` blocks, parsed from a reply.

The model writes a call as text, one JSON object per block:

    <tool_call>
    {"name": "python", "arguments": {"code": "print(6 * 7)"}}
    </tool_call>

`parse_tool_calls` finds every block of a reply, well formed or not, so that both readers of a
reply use one parser: the OpenAI-compatible server (`server/chat_messages.py`), which hands the
well-formed calls to the client, and the tool agent (`agents/tool.py`), which runs them and
answers a malformed one with an error the model can learn from. Training never sees this parse:
it uses the ids the engine sampled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrl.bounded_json import load_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One `<tool_call>` block of a reply: its name and arguments as written, or why it is malformed."""

    name: str | None
    arguments: Any  # what the block's "arguments" (or "parameters") held: a mapping, a JSON string, ...
    error: str | None  # None for a well-formed block; else what is wrong, said to the model
    start: int  # where the block starts in the reply text
    end: int  # where it ends (after its closing; the text's end for a block never closed)

    @property
    def ok(self) -> bool:
        """True when the block is a JSON object with a string "name"."""
        return self.error is None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>` block of `text`, in order; a block whose JSON does not parse, that is
    not an object with a string "name", or that is never closed is returned with its `error`."""
    # One left-to-right scan: each search starts where the last one ended, so the work is linear
    # in the text however many openings it holds (a regex retried at every opening is quadratic).
    calls = []
    at = 0
    while (start := text.find(OPEN, at)) >= 0:
        body = start + len(OPEN)
        close = text.find(CLOSE, body)
        if close < 0:  # an opening without its closing (a reply cut short, or a typo): the rest is one block
            calls.append(ToolCall(None, None, f"{OPEN} is not closed with {CLOSE}", start, len(text)))
            break
        at = close + len(CLOSE)
        calls.append(_call(text[body:close].strip(), start, at))
    return calls


def _call(body: str, start: int, end: int) -> ToolCall:
    try:
        data = load_json(body)
    except ValueError as e:
        return ToolCall(None, None, f"the tool call is not valid JSON ({e})", start, end)
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall(None, None, 'the tool call must be a JSON object with a string "name" and an object '
                        '"arguments"', start, end)
    return ToolCall(data["name"], data.get("arguments", data.get("parameters", {})), None, start, end)


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """The block a model writes to call `name` with `arguments` (Qwen's spacing)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"
