"""What the server's routes share: the engine and the loop it lives in, the tokenizer, the caps of
`serve.*`, the sessions and the admin key (one `ServerState` per app, made by `build_app`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from agentrl.config.serve import ServeConfig
from agentrl.llm.server.openai_schema import RequestError
from agentrl.llm.server.sessions import SessionStore, in_loop


@dataclass
class ServerState:
    """What the routes share: the engine and where it lives, the tokenizer, caps, sessions."""

    engine: Any  # an InferenceEngine, or None for a server that only hosts sessions
    tokenizer: Any
    cfg: ServeConfig
    model_name: str
    engine_loop: asyncio.AbstractEventLoop | None = None  # None: the server's own loop
    sessions: SessionStore = field(default_factory=SessionStore)
    admin_key: str = ""  # what the control routes take: cfg.api_key, or one made at start-up
    inflight: int = 0

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
