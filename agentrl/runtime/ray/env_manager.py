"""An env manager as a Ray actor (ROLL's name): it builds every tag's envs and agents from the
config and plays the episodes of the groups it is given, all at once, with the same collector
as the local runtime (rollout/collector.py: retries, timeouts, failed groups dropped), against
the engine replicas bound to it (by Ray actor calls, or over HTTP: runtime.engine_transport), or
against the inference servers of engine.kind=remote / vllm (runtime/ray/served.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agentrl.rollout.collector import CollectResult
from agentrl.rollout.stream import play_groups
from agentrl.runtime.assembly.envs import bind, import_user_modules, make_budget, make_collector
from agentrl.runtime.ray.engine_client import RayEngineClient
from agentrl.runtime.ray.engine_http import HttpEngineClient
from agentrl.runtime.ray.served import served_client
from agentrl.runtime.ray.workers import SharedSpec, node_id, setup_worker
from agentrl.trajectory import Task


class EnvManagerActor:
    """Plays episodes for the trainer; many at once, as asyncio tasks in the actor's event loop."""

    def __init__(self, shared: SharedSpec, engines: list[Any], engine_names: list[str], index: int,
                 api_key: str | None = None) -> None:
        spec = shared.get()
        rt = spec.plan.runtime
        setup_worker(rt.num_threads, spec.registrations)
        import_user_modules(spec.plan.imports)
        run_plan = bind(spec.plan)
        self.index, self.plan, self.api_key = index, run_plan, api_key
        self.client = self._client(engines, engine_names)
        self.collector = make_collector(run_plan, spec.tokenizer, self.client, make_budget(run_plan, spec.context),
                                        spec.vocab_size)

    def _client(self, engines: list[Any], engine_names: list[str]) -> Any:
        """The LLMClient over `engines`: Ray actor calls, or HTTP (runtime.engine_transport; served engines)."""
        rt, index = self.plan.runtime, self.index
        if self.plan.engine_kind.served:  # inference servers over HTTP (runtime/ray/served.py)
            return served_client(self.plan, engines, engine_names, self.api_key, index)
        if rt.engine_transport == "http":  # requests carry their seeds: the stream is a fallback
            return HttpEngineClient(engines, engine_names, self.api_key or "", rt.restart_timeout,
                                    self.plan.engine.request_timeout, seed=self.plan.seed + index)
        return RayEngineClient(engines, engine_names, client=f"env_manager-{index}",
                               restart_timeout=rt.restart_timeout)

    async def rebind(self, engines: list[Any], engine_names: list[str]) -> list[str]:
        """Play later episodes on `engines` (replicas added or removed between steps: elastic.py)."""
        self.client = self.collector.llm = self._client(engines, engine_names)
        return engine_names

    async def collect(self, tasks: list[Task], first_attempt: int = 0) -> CollectResult:
        """Play `tasks` (whole groups) to the end; `first_attempt` > 0 replays tasks whose
        earlier attempts died with a previous incarnation of this actor."""
        return await self.collector.acollect(tasks, first_attempt)

    async def play_groups(self, groups: list[list[Task]],
                          first_attempt: int = 0) -> AsyncIterator[tuple[int, CollectResult]]:
        """Play `groups` together (a batch of the asynchronous stream, rollout/stream.py); yields
        (position in `groups`, result) as each group ends, in the order they end."""
        async for item in play_groups(self.collector, groups, first_attempt):
            yield item

    async def set_policy_version(self, version: int, model: str | None = None) -> None:
        """The version trainer rank 0 last pushed to the servers (engine.kind=remote / vllm): a client
        stamps it on ids where the servers do not, as the local run's engine does. `model`: the LoRA
        adapter that push loaded into vLLM, which requests then name (and stamp at send, as
        `VllmEngine` does: the server labels only its base weights)."""
        if hasattr(self.client, "policy_version"):
            self.client.policy_version = version
        if model is None:
            return
        if isinstance(self.client, HttpEngineClient):  # the run's vLLM replicas, reached once connected
            await self.client.connect()
        remote = getattr(self.client, "remote", self.client)
        remote.wire.model, remote.wire.server_versions = model, False
        remote.policy_version = version  # what the client stamps at send now

    async def info(self) -> dict[str, Any]:
        """Where it runs (and, over HTTP, the engine servers it reaches: started now, not mid-step)."""
        urls = await self.client.connect() if isinstance(self.client, HttpEngineClient) else None
        return {"node": node_id(), "index": self.index, "engine_urls": urls}
