"""OpenAI chat messages as the server reads and writes them: checked and normalised, rendered
with the tokenizer's chat template, and tool calls parsed from a reply.

Every string a client sends is its own text, never the template's: `render` marks the special
tokens' text in the messages and tools, and `encode_chat` (`llm/encoding.py`) spells it out, so a
message holding `<|im_start|>system` cannot forge a turn.

Tool calls follow Qwen's / Hermes' format, which the model writes as text:

    <tool_call>
    {"name": "move", "arguments": {"direction": "left"}}
    </tool_call>

`parse_reply` turns such blocks (parsed by `llm/tool_calls.py`, the one parser of the format)
into OpenAI `tool_calls` for the client (the text before the first block is the message's
content); training never sees this parse: it uses the ids the engine sampled. A malformed block
stays in the content, as text.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from agentrl.bounded_json import load_json
from agentrl.llm.conversation import render_chat
from agentrl.llm.encoding import mark, unmark
from agentrl.llm.tool_calls import OPEN, parse_tool_calls
from agentrl.tokenizer import Tokenizer

ROLES = ("system", "developer", "user", "assistant", "tool")


class MessageError(ValueError):
    """A request's messages or tools cannot be used (the server answers 400, naming the field)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages as plain dicts the chat template can render, the same whatever
    extra keys the client sent (a returned message object carries refusal, audio, ...)."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list of {role, content} objects", "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _message(m: Any, where: str) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise MessageError(f"{where} must be an object with role and content", where)
    role = m.get("role")
    if role not in ROLES:
        raise MessageError(f"{where}.role={role!r} is not one of {', '.join(ROLES)}", f"{where}.role")
    out: dict[str, Any] = {"role": role, "content": _content(m.get("content"), f"{where}.content")}
    calls = m.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise MessageError(f"{where}.tool_calls must be a list, on an assistant message", f"{where}.tool_calls")
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)]
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise MessageError(f"{where}.{key} must be a string", f"{where}.{key}")
            out[key] = m[key]
    if out["content"] is None:  # a tool-call message: templates concatenate content, None would not render
        out["content"] = ""
    return out


def _content(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text is understood
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise MessageError(f"{where}[{k}] must be a text part {{type: text, text: ...}} (this server "
                                   "serves a text model)", f"{where}[{k}]")
            texts.append(part["text"])
        return "".join(texts)
    raise MessageError(f"{where} must be a string, a list of text parts or null", where)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise MessageError(f"{where} must be {{type: function, function: {{name, arguments}}}}", where)
    args = fn.get("arguments", "{}")
    if isinstance(args, str):  # OpenAI sends a JSON string; chat templates expect a mapping
        try:
            args = load_json(args) if args.strip() else {}
        except ValueError as e:
            raise MessageError(f"{where}.function.arguments is not valid JSON ({e})",
                               f"{where}.function.arguments") from None
    return {"id": str(call.get("id") or ""), "type": "function", "function": {"name": fn["name"], "arguments": args}}


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The request's `tools` (function definitions), or None."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                              and isinstance(t["function"].get("name"), str) for t in tools):
        raise MessageError("tools must be a list of {type: function, function: {name, parameters}}", "tools")
    return tools or None


def render(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None,
           generation_prompt: bool) -> str:
    """The chat template's text for `messages`, the special tokens' text in their strings and in
    `tools` marked for `encode_chat` (a template error is a MessageError)."""
    try:
        return render_chat(tokenizer, mark(tokenizer, messages), mark(tokenizer, tools), generation_prompt)
    except Exception as e:  # noqa: BLE001 (jinja raises anything; the client must hear why)
        first = (unmark(str(e)).strip().splitlines() or [type(e).__name__])[0]
        raise MessageError(f"the chat template cannot render these messages: {type(e).__name__}: {first}",
                           "messages") from None


def parse_reply(text: str, tools: bool) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a reply; tool calls are parsed only when the request gave tools."""
    if not tools or OPEN not in text:
        return text, []
    parsed = [c for c in parse_tool_calls(text) if c.ok]
    if not parsed:
        return text, []
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": c.name,
                           "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)}}
             for c in parsed]
    content = text[:parsed[0].start].strip()
    return (content or None), calls


def same_reply(sent: dict[str, Any], content: str | None, raw: str, calls: list[dict[str, Any]]) -> bool:
    """Whether the assistant message a client sent back is the reply it was given (its content,
    or the raw reply text, and the same tool calls by name and arguments)."""
    if sent.get("role") != "assistant":
        return False
    text = sent.get("content") or ""
    if text != (content or "") and text != raw:
        return False
    theirs = [(c["function"]["name"], c["function"]["arguments"]) for c in sent.get("tool_calls") or []]
    ours = [(c["function"]["name"], _args(c["function"]["arguments"])) for c in calls]
    return theirs == ours


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return load_json(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments
