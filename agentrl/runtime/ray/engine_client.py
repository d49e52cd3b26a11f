"""The `LLMClient` env managers hand their agents on Ray: generate() over Ray actor calls to the
engine replicas bound to that env manager. This module is the one place that speaks the engine
actor's wire protocol; an HTTP client to engine servers (llm/remote/engine.py) can take its place.

Protocol (runtime/ray/engine_actor.py's `serve`): one call in flight per (client, replica) at a time,
carrying the requests submitted since the last call and the ids of requests whose caller gave up;
it returns once at least one of this client's requests has finished. Between two calls the
client lets every episode whose reply arrived run up to its next request (one event-loop turn),
so with one client per replica the engine admits exactly what the in-process engine admits
after each of its steps: the same batches, the same samples, the same metrics.

Routing is sticky per episode attempt (per asyncio task, or the episode an OpenAI-client session
generates for): the first request of an episode goes to the least-loaded replica, the rest
follow it, so its prefix cache serves every turn.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import weakref
from typing import Any

from agentrl.errors import EngineError
from agentrl.llm.engine import Completion, SamplingParams, episode_key

RESTART_POLL = 0.2  # seconds between tries to reach a replica that is restarting


def first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's message (Ray's carry whole tracebacks)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


class ReplicaLink:
    """The requests of one client to one engine replica, and the call loop that serves them."""

    def __init__(self, handle: Any, name: str, client: str, restart_timeout: float) -> None:
        self.handle = handle
        self.name = name
        self.client = client
        self.incarnation = f"{os.getpid()}-{id(self)}"  # a restarted client is a new one to the replica
        self.restart_timeout = restart_timeout
        self.pending: list[tuple[int, list[int], SamplingParams]] = []  # submitted, not yet sent
        self.sent: dict[int, asyncio.Future] = {}  # sent, not yet finished
        self.waiting: dict[int, asyncio.Future] = {}  # every unfinished request
        self.cancelled: list[int] = []
        self._ids = itertools.count()
        self._driver: asyncio.Task | None = None
        self.down = False  # the replica died: wait for its restart before the next call

    @property
    def load(self) -> int:
        """Unfinished requests."""
        return len(self.waiting)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Queue one request for the next call and wait for its completion."""
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self.waiting[rid] = future
        self.pending.append((rid, list(prompt_ids), sampling))
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        try:
            return await future
        except asyncio.CancelledError:  # the episode timed out or was cancelled: tell the replica
            if self.waiting.pop(rid, None) is not None and rid in self.sent:
                self.cancelled.append(rid)
            self.pending = [p for p in self.pending if p[0] != rid]
            raise

    async def _drive(self) -> None:
        while self.waiting:
            new, self.pending = self.pending, []
            cancelled, self.cancelled = self.cancelled, []
            for rid, _, _ in new:
                self.sent[rid] = self.waiting[rid]
            try:
                done = await self._call(new, cancelled)
            except EngineError as e:
                self._fail_all(e)
                return
            for rid, completion, error in done:
                self.sent.pop(rid, None)
                future = self.waiting.pop(rid, None)
                if future is None or future.done():
                    continue
                if error is not None:
                    future.set_exception(EngineError(f"{self.name}: {error}"))
                else:
                    future.set_result(completion)
            await asyncio.sleep(0)  # episodes whose reply arrived run up to their next request

    async def _call(self, new: list, cancelled: list[int]) -> list:
        """One serve call. A replica that dies fails every request it held (their episodes fail as
        engine errors and are retried under rollout.max_retries); requests made after that wait
        (up to restart_timeout) until Ray has restarted it."""
        import ray

        if self.down:
            await self._wait_up()
        try:
            return await self.handle.serve.remote(self.client, self.incarnation, new, cancelled)
        except ray.exceptions.ActorDiedError as e:
            raise EngineError(f"{self.name} died and will not restart: {first_line(e)}") from None
        except ray.exceptions.RayActorError as e:  # died (or was found restarting): Ray restarts it
            self.down = True
            self._fail(list(self.sent), EngineError(f"{self.name} died with this request in flight: {first_line(e)}"))
            return []

    async def _wait_up(self) -> None:
        """Until the replica answers again; an EngineError when it will not."""
        await call_when_up(self.handle.info.remote, self.name, self.restart_timeout)
        self.down = False

    def _fail(self, rids: list[int], error: Exception) -> None:
        for rid in rids:
            self.sent.pop(rid, None)
            future = self.waiting.pop(rid, None)
            if future is not None and not future.done():
                future.set_exception(error)

    def _fail_all(self, error: Exception) -> None:
        self._fail(list(self.waiting), error)
        self.pending.clear()


class RayEngineClient:
    """An LLMClient over the engine replicas bound to one env manager."""

    def __init__(self, handles: list[Any], names: list[str], client: str, restart_timeout: float = 120.0) -> None:
        if not handles:
            raise ValueError("RayEngineClient needs at least one engine replica")
        self.links = [ReplicaLink(h, n, client, restart_timeout) for h, n in zip(handles, names)]
        self._route: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # episode task -> link

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Continue `prompt_ids` on the replica serving this episode."""
        episode = episode_key()  # the episode's task (an OpenAI-client session generates from another one)
        link = self._route.get(episode) if episode is not None else None
        if link is None:
            link = min(self.links, key=lambda k: k.load)  # ties: the first, so one replica is deterministic
            if episode is not None:
                self._route[episode] = link
        return await link.generate(prompt_ids, sampling)


async def call_when_up(call: Any, name: str, restart_timeout: float) -> Any:
    """`await call()` on a replica actor, retried while Ray restarts it (up to `restart_timeout`
    seconds); an EngineError naming the replica when it died for good or did not come back."""
    import ray

    deadline = time.monotonic() + restart_timeout
    while True:
        try:
            return await call()
        except ray.exceptions.RayActorError as e:
            check_restarting(e, name, restart_timeout, deadline)
            await asyncio.sleep(RESTART_POLL)


def check_restarting(error: BaseException, name: str, restart_timeout: float, deadline: float) -> None:
    """Returns while Ray may still be restarting the replica `name` that raised `error` (a Ray
    actor error) before the `time.monotonic()` `deadline`; else the EngineError naming it (died for
    good, or not back within `restart_timeout`). The one rule of every wait for a restarted replica."""
    import ray

    if isinstance(error, ray.exceptions.ActorDiedError):
        raise EngineError(f"{name} died and will not restart: {first_line(error)}") from None
    if time.monotonic() > deadline:
        raise EngineError(f"{name} did not come back within runtime.restart_timeout="
                          f"{restart_timeout}s: {first_line(error)}") from None
