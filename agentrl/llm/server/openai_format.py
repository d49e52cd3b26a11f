"""Response bodies of the server's routes: OpenAI chat and text completions (whole or as
server-sent events), vLLM's token route, errors.

Every choice reports the policy version of each generated id (`policy_versions`) and the
response the version the server holds (`policy_version`); with vLLM's `return_token_ids` (and
always in a session) the ids themselves: `prompt_token_ids` and `choices[].token_ids`.
Streaming answers once the completion is generated (the engine returns whole completions): the
text arrives as one event per generated token, then the finish reason, usage, and `[DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from agentrl.llm.conversation import completion_versions
from agentrl.llm.server.sessions import Choice
from agentrl.tokenizer import Tokenizer


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large",
            429: "rate_limit_error"}.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": _printable(message), "type": kind, "param": param and _printable(param),
                      "code": code}}


def _printable(text: str) -> str:
    """`text` as valid UTF-8: a lone surrogate a request smuggled in (JSON's \\ud800) is escaped,
    not left to fail the response's encoding."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def new_id(prefix: str) -> str:
    """A response id, e.g. chatcmpl-1f0c..."""
    return f"{prefix}-{uuid.uuid4().hex}"


def token_texts(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """Each id's own text (byte-level pieces of a multi-byte character decode to U+FFFD)."""
    return [tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def _chat_logprobs(tokenizer: Tokenizer, choice: Choice, top: list[list[tuple[int, float]]] | None) -> dict[str, Any]:
    c = choice.completion
    texts = token_texts(tokenizer, c.token_ids)
    content = []
    for i, (text, lp) in enumerate(zip(texts, c.logprobs)):
        alts = [{"token": tokenizer.decode([t], skip_special_tokens=False), "logprob": v,
                 "bytes": list(tokenizer.decode([t], skip_special_tokens=False).encode())}
                for t, v in (top[i] if top else [])]
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": alts})
    return {"content": content}


def chat_body(model: str, prompt_ids: list[int], choices: list[Choice], tokenizer: Tokenizer, *, logprobs: bool,
              top: list[list[list[tuple[int, float]]]] | None, with_ids: bool, version: int) -> dict[str, Any]:
    """A chat.completion object."""
    out = []
    for i, ch in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": ch.content}
        if ch.tool_calls:
            message["tool_calls"] = ch.tool_calls
        item: dict[str, Any] = {"index": i, "message": message, "finish_reason": ch.finish_reason,
                                "logprobs": (_chat_logprobs(tokenizer, ch, top[i] if top else None)
                                             if logprobs else None),
                                "policy_versions": completion_versions(ch.completion)}
        if with_ids:
            item["token_ids"] = list(ch.completion.token_ids)
        out.append(item)
    body = {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": out, "usage": _usage(len(prompt_ids), choices), "policy_version": version}
    if with_ids:
        body["prompt_token_ids"] = list(prompt_ids)
    return body


def _usage(prompt_tokens: int, choices: list[Choice], prompts: int = 1) -> dict[str, int]:
    generated = sum(len(c.completion.token_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens * prompts, "completion_tokens": generated,
            "total_tokens": prompt_tokens * prompts + generated}


def completion_choice(index: int, prompt_ids: list[int], ch: Choice, tokenizer: Tokenizer, logprobs: int | None,
                      top: list[list[tuple[int, float]]] | None, with_ids: bool) -> dict[str, Any]:
    """One choice of a text_completion object."""
    item: dict[str, Any] = {"index": index, "text": ch.raw if ch.content is None else ch.content,
                            "finish_reason": ch.finish_reason, "logprobs": None,
                            "policy_versions": completion_versions(ch.completion)}
    if logprobs is not None:
        texts = token_texts(tokenizer, ch.completion.token_ids)
        offsets, pos = [], 0
        for t in texts:
            offsets.append(pos)
            pos += len(t)
        item["logprobs"] = {"tokens": texts, "token_logprobs": list(ch.completion.logprobs),
                            "top_logprobs": ([{tokenizer.decode([t]): v for t, v in row} for row in top]
                                             if top else None),
                            "text_offset": offsets}
    if with_ids:
        item["token_ids"] = list(ch.completion.token_ids)
        item["prompt_token_ids"] = list(prompt_ids)
    return item


def completion_body(model: str, choices: list[dict[str, Any]], prompt_tokens: int, generated: int,
                    version: int) -> dict[str, Any]:
    """A text_completion object."""
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "policy_version": version,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                      "total_tokens": prompt_tokens + generated}}


def text_deltas(tokenizer: Tokenizer, ids: list[int], text: str) -> list[tuple[str, list[int]]]:
    """`text` (a prefix of the decoded `ids`) cut at token boundaries: (delta, ids) per event; a
    token ending inside a multi-byte character waits for the next one."""
    out: list[tuple[str, list[int]]] = []
    sent, pending = 0, []
    for k in range(1, len(ids) + 1):
        pending.append(ids[k - 1])
        upto = tokenizer.decode(ids[:k], skip_special_tokens=True)
        if upto.endswith("\ufffd") and k < len(ids):
            continue
        end = min(len(upto), len(text))
        out.append((text[sent:end], pending))
        sent, pending = max(sent, end), []
    if pending:
        out.append(("", pending))
    return out


def chat_events(body: dict[str, Any], choices: list[Choice], tokenizer: Tokenizer,
                include_usage: bool) -> Iterator[str]:
    """The server-sent events of a chat completion `body` (already generated)."""
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    with_ids = "prompt_token_ids" in body
    for i, (ch, item) in enumerate(zip(choices, body["choices"])):
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        if with_ids:
            first["prompt_token_ids"] = body["prompt_token_ids"]
        yield _event({**base, "choices": [first]})
        logprobs = (item["logprobs"] or {}).get("content") if item["logprobs"] else None
        at = 0
        for delta, ids in text_deltas(tokenizer, list(ch.completion.token_ids), ch.content or ""):
            chunk: dict[str, Any] = {"index": i, "delta": {"content": delta}, "finish_reason": None}
            if logprobs is not None:
                chunk["logprobs"] = {"content": logprobs[at:at + len(ids)]}
            if with_ids:
                chunk["token_ids"] = ids
            at += len(ids)
            yield _event({**base, "choices": [chunk]})
        if ch.tool_calls:
            calls = [{"index": k, **c} for k, c in enumerate(ch.tool_calls)]
            yield _event({**base, "choices": [{"index": i, "delta": {"tool_calls": calls}, "finish_reason": None}]})
        yield _event({**base, "choices": [{"index": i, "delta": {}, "finish_reason": item["finish_reason"],
                                           "policy_versions": item["policy_versions"]}]})
    if include_usage:
        yield _event({**base, "choices": [], "usage": body["usage"]})
    yield "data: [DONE]\n\n"


def completion_events(body: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """The server-sent events of a text completion `body` (one event per choice, then [DONE])."""
    base = {k: body[k] for k in ("id", "created", "model")}
    for item in body["choices"]:
        yield _event({**base, "object": "text_completion", "choices": [item]})
    if include_usage:
        yield _event({**base, "object": "text_completion", "choices": [], "usage": body["usage"]})
    yield "data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def vllm_body(request_id: str, ch: Choice, tokenizer: Tokenizer, logprobs: bool) -> dict[str, Any]:
    """vLLM's GenerateResponse: choices[0].token_ids (+ logprobs.content), our per-id versions."""
    c = ch.completion
    item: dict[str, Any] = {"index": 0, "finish_reason": c.finish_reason, "token_ids": list(c.token_ids),
                            "logprobs": _chat_logprobs(tokenizer, ch, None) if logprobs else None,
                            "policy_versions": completion_versions(c)}
    return {"request_id": request_id, "choices": [item], "prompt_logprobs": None, "kv_transfer_params": None}
