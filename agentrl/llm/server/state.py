"""What the server's routes share: the engine and the loop it lives in, the tokenizer, the caps of
`serve.*`, the sessions and the admin key (one `ServerState` per app, made by `build_app`), and
the steps every route takes: its body read as JSON under its cap, admission under
serve.max_inflight, the model id checked.

Every request body is read with a size cap, counted as it streams in (413 beyond it; see
guard.py), parsed as strict JSON (400 naming what is wrong), and only then reaches the engine,
in the engine's own loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from agentrl.config.serve import ServeConfig
from agentrl.llm.server.guard import read_body
from agentrl.llm.server.openai_schema import RequestError
from agentrl.llm.server.sessions import SessionStore, in_loop
from agentrl.tokenizer import Tokenizer

# JSON text that may decode to a lone UTF-16 surrogate: an escape of one (a valid pair matches
# too, and is then let through) or the CESU-8 bytes of one (json decodes bytes with surrogatepass).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


@dataclass
class ServerState:
    """What the routes share: the engine and where it lives, the tokenizer, caps, sessions."""

    engine: Any  # an InferenceEngine, or None for a server that only hosts sessions
    tokenizer: Tokenizer | None  # None with the engine: a server that only hosts sessions
    cfg: ServeConfig
    model_name: str
    engine_loop: asyncio.AbstractEventLoop | None = None  # None: the server's own loop
    sessions: SessionStore = field(default_factory=SessionStore)
    admin_key: str = ""  # what the control routes take: cfg.api_key, or one made at start-up
    inflight: int = 0

    @property
    def served_tokenizer(self) -> Tokenizer:
        """The tokenizer of the engine served (404 on a server that only hosts sessions)."""
        if self.tokenizer is None:
            raise RequestError(404, "this server only hosts sessions (/sessions/<id>/v1); it serves no engine")
        return self.tokenizer

    async def call(self, fn: Any, *args: Any) -> Any:
        """Run engine method `fn(*args)` (sync or async) in the engine's loop."""
        if self.engine is None:
            raise RequestError(404, "this server only hosts sessions (/sessions/<id>/v1); it serves no engine")

        async def run() -> Any:
            out = fn(*args)
            return await out if asyncio.iscoroutine(out) else out
        return await in_loop(self.engine_loop, run)

    def version(self) -> int:
        """The policy version the engine serves (0 without an engine)."""
        return int(getattr(self.engine, "policy_version", 0)) if self.engine is not None else 0


async def read_json(request: Request, cfg: ServeConfig) -> Any:
    """The request body as JSON (400 when it is not, or when a string in it is not valid Unicode)."""
    body = await read_body(request, cfg.max_request_bytes, cfg.idle_timeout)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        first = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise RequestError(400, f"the request body is not valid JSON: {first}") from None
    if _SURROGATE.search(body):
        where = _unpaired(data, "")
        if where is not None:
            raise RequestError(400, f"{where or 'body'}: a lone UTF-16 surrogate (e.g. \\ud800) is not a character; "
                                    "send valid Unicode", where or None)
    return data


def _unpaired(value: Any, where: str) -> str | None:
    """Where in `value` a string holds a lone surrogate (None: nowhere)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _unpaired(key, where) is not None:
            return where
        found = _unpaired(item, f"{where}.{key}".lstrip(".") if isinstance(key, str) else f"{where}[{key}]")
        if found is not None:
            return found
    return None


@contextlib.contextmanager
def admitted(state: ServerState) -> Iterator[None]:
    """Count a generation request in flight; 429 beyond serve.max_inflight."""
    if state.inflight >= state.cfg.max_inflight:
        raise RequestError(429, f"the server is busy ({state.inflight} requests in flight, serve.max_inflight)")
    state.inflight += 1
    try:
        yield
    finally:
        state.inflight -= 1


def check_model(state: ServerState, model: str | None) -> None:
    """404 for a model id this server does not serve (sessions accept any), or when it serves
    no engine (a run's session server)."""
    if state.engine is None:
        raise RequestError(404, "this server only hosts sessions: use /sessions/<id>/v1/chat/completions")
    if model is not None and model != state.model_name:
        raise RequestError(404, f"model {model!r} does not exist; this server serves {state.model_name!r}",
                           "model", "model_not_found")


def eos_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The ids that end a reply."""
    return (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
