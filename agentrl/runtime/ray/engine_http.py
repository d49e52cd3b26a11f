"""The `LLMClient` env managers hand their agents with runtime.engine_transport=http: a
`RemoteEngine` (llm/remote/engine.py: sticky routing, seeds travel with requests, per-id versions) on
the agentrl servers of the engine replicas bound to this env manager, the same contract as a
local run on `engine.kind=remote`.

URLs come from the replica actors themselves (`EngineActor.http_url`), asked on first use. A
replica that Ray restarted serves on a new port: when a request fails, this client asks every
replica for its current URL (waiting up to runtime.restart_timeout for one that is restarting),
points the RemoteEngine at what changed, and lets the request fail as an engine error, so its
episode is retried under rollout.max_retries, as with the ray transport.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.errors import EngineError
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.llm.remote.engine import RemoteEngine
from agentrl.llm.remote.wire import VllmWire
from agentrl.runtime.ray.engine_client import call_when_up


class HttpEngineClient:
    """An LLMClient over the HTTP servers of the engine replicas bound to one env manager."""

    def __init__(self, handles: list[Any], names: list[str], api_key: str, restart_timeout: float = 120.0,
                 request_timeout: float = 600.0, seed: int = 0, protocol: str = "agentrl") -> None:
        if not handles:
            raise ValueError("HttpEngineClient needs at least one engine replica")
        self.handles, self.names, self.api_key = handles, names, api_key
        self.restart_timeout, self.request_timeout, self.seed = restart_timeout, request_timeout, seed
        self.protocol = protocol  # agentrl (EngineActor's servers) or vllm (runtime/ray/vllm_replica.py's)
        self.remote: RemoteEngine | None = None
        self._lock: asyncio.Lock | None = None  # made in the actor's event loop
        self._refreshes = 0  # times the URLs were asked again (requests that failed before one need not ask)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Continue `prompt_ids` on the replica serving this episode."""
        if self.remote is None:
            await self.connect()
        assert self.remote is not None
        seen = self._refreshes
        try:
            return await self.remote.generate(prompt_ids, sampling)
        except EngineError:
            await self._refresh(seen)
            raise

    async def urls(self) -> list[str]:
        """Every replica's current URL (each started on first ask)."""
        return list(await asyncio.gather(*(self._url(h, n) for h, n in zip(self.handles, self.names))))

    async def connect(self) -> list[str]:
        """Ask the replicas for their URLs (starting their servers) and open the RemoteEngine on them."""
        async with self._get_lock():
            if self.remote is None:
                # One retry only: on loopback or a cluster network a failure is a dead replica,
                # and waiting for its restart is this client's job, not a blind backoff's.
                self.remote = RemoteEngine(await self.urls(), self.protocol, api_key=self.api_key,
                                           timeout=self.request_timeout, max_retries=1, retry_delay=0.1, seed=self.seed)
                wire = self.remote.wire
                if isinstance(wire, VllmWire):  # protocol vllm: the replicas label their weights with our versions
                    wire.server_versions = True
            return list(self.remote.urls)

    async def _refresh(self, seen: int) -> None:
        """Learn the replicas' current URLs, once for every request that failed meanwhile."""
        async with self._get_lock():
            if self._refreshes != seen or self.remote is None:
                return
            for i, url in enumerate(await self.urls()):
                if url != self.remote.urls[i]:
                    self.remote.set_url(i, url)
            self._refreshes += 1

    async def _url(self, handle: Any, name: str) -> str:
        """`handle`'s URL, waiting (up to restart_timeout) while Ray restarts it."""
        return await call_when_up(handle.http_url.remote, name, self.restart_timeout)

    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock
