"""An engine replica as a Ray actor: a `LocalEngine` built from the config, served to the env
managers' clients (runtime/ray/engine_client.py) and fed new weights by trainer rank 0.

The engine steps only inside `serve` calls: a call adds its client's new requests, then steps
the engine until one of that client's requests has finished (another client's call in flight
steps it too). With one client this is the in-process engine's own loop, split at the points
where it would hand control to the episodes.

A replica that Ray restarted after a crash serves nothing until trainer rank 0 has given it the
current weights (`needs_weights` / `load_weights` / `accept_initial`): it never samples from a
stale policy.

With runtime.engine_transport=http the actor serves the agentrl HTTP API instead (`http_url`:
llm/server/app.py in the actor's own event loop, on the node's IP, a free port, the run's key), and
env managers hold a `RemoteEngine` on those URLs (runtime/ray/engine_http.py). The engine then steps
itself as in `agentrl serve`; weights still arrive through `load_weights`, and a restarted
replica's server holds requests until they have.
"""

from __future__ import annotations

import asyncio
import functools
import warnings
from typing import Any

from agentrl.errors import EngineError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.source import forget_evaluation
from agentrl.runtime.ray.weight_sync import WeightPayload, make_transport
from agentrl.runtime.ray.workers import RunSpec, SharedSpec, load_model, node_id, setup_worker


def was_restarted() -> bool:
    """Whether Ray restarted this actor after a crash (its constructor runs again)."""
    import ray

    if not ray.is_initialized():  # built outside Ray (tests drive it in-process)
        return False
    with warnings.catch_warnings():  # deprecated in favour of nothing yet; still answers
        warnings.simplefilter("ignore")
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def ready_gate(event: asyncio.Event | None, restarted: bool) -> asyncio.Event:
    """A replica's gate of serving, `event` once made (in the actor's event loop, on first use):
    open, but for a replica Ray `restarted`, which serves only once trainer rank 0 has given it the
    current weights (and opens it)."""
    if event is None:
        event = asyncio.Event()
        if not restarted:
            event.set()
    return event


def _note_finished(order: list[int], rid: int, _future: asyncio.Future[Any]) -> None:
    """A request's done callback: `rid` joins its client's finishing order."""
    order.append(rid)


class EngineActor:
    """One engine replica. Every method is async, so all of them run on the actor's event loop,
    one at a time between two engine steps (Ray runs an async actor's sync methods in threads)."""

    def __init__(self, shared: SharedSpec | RunSpec, index: int, seed: int, api_key: str | None = None) -> None:
        spec = shared.get() if isinstance(shared, SharedSpec) else shared
        run_plan = spec.plan
        setup_worker(run_plan.runtime.num_threads)
        self.plan = run_plan
        self.index = index
        self.tokenizer = tokenizer = spec.tokenizer
        engine_model = load_model(spec.model, run_plan.runtime.actor_infer, run_plan.model.dtype)
        self.engine = LocalEngine.from_config(engine_model, tokenizer, run_plan.engine, run_plan.rollout.max_model_len,
                                              seed=seed)
        self.restarted = was_restarted()
        self._ready: asyncio.Event | None = None  # made in the actor's event loop
        self.clients: dict[str, tuple[str, dict[int, asyncio.Future]]] = {}  # name -> (incarnation, requests)
        self._finished: dict[str, list[int]] = {}  # per client: ids in the order the engine finished them
        self.transport: Any = None  # set for the broadcast transport (join_weight_group)
        self.api_key = api_key  # runtime.engine_transport=http: the run's key (kept across restarts)
        self.server: Any = None  # (uvicorn server, its task, url) once http_url started it

    # ------------------------------------------------------------------ serving
    async def serve(self, client: str, incarnation: str, new: list[tuple[int, list[int], SamplingParams]],
                    cancelled: list[int]) -> list[tuple[int, Any, str | None]]:
        """Add `client`'s new requests, drop the cancelled ones, step until one of its requests
        has finished; returns (id, completion, error) of each finished one, in finishing order."""
        await self._ready_event().wait()
        mine, order = self._client(client, incarnation)
        loop = asyncio.get_running_loop()
        for rid, prompt_ids, sampling in new:
            future = loop.create_future()
            future.add_done_callback(functools.partial(_note_finished, order, rid))
            mine[rid] = future
            try:
                self.engine.submit(prompt_ids, sampling, future)
            except EngineError as e:  # a bad request fails alone
                future.set_exception(e)
        for rid in cancelled:
            dropped = mine.pop(rid, None)
            if dropped is not None:
                dropped.cancel()  # the engine drops it at its next step
        await asyncio.sleep(0)  # run the callbacks of requests that failed on submit
        while mine and not order:
            if self.engine.has_work():
                self.engine.serve_step()
            else:  # another client's call stepped: the done callbacks of ours are about to run
                assert all(f.done() for f in mine.values()), "a request is neither queued nor finished"
            await asyncio.sleep(0)  # run done callbacks; let other clients' calls add requests
        out: list[tuple[int, Any, str | None]] = []
        for rid in order:
            done = mine.pop(rid, None)
            if done is None or done.cancelled():
                continue
            error = done.exception()
            out.append((rid, None, f"{type(error).__name__}: {error}") if error else (rid, done.result(), None))
        order.clear()
        return out

    def _client(self, client: str, incarnation: str) -> tuple[dict[int, asyncio.Future], list[int]]:
        """The requests of `client`; a new incarnation (a restarted env manager) drops the old one's."""
        known = self.clients.get(client)
        if known is None or known[0] != incarnation:
            if known is not None:
                for future in known[1].values():
                    future.cancel()
            self.clients[client] = (incarnation, {})
            self._finished[client] = []
        return self.clients[client][1], self._finished[client]

    def _ready_event(self) -> asyncio.Event:
        self._ready = ready_gate(self._ready, self.restarted)
        return self._ready

    async def http_url(self) -> str:
        """The URL of this replica's agentrl server (runtime.engine_transport=http), started on the
        first call; a replica Ray restarted starts a new one, on a new port."""
        if self.server is None:
            from agentrl.config.serve import ServeConfig
            from agentrl.llm.server.app import build_app, serve_in_loop

            if self.api_key is None:
                raise EngineError(f"engine-{self.index} was started without runtime.engine_transport=http")
            # No serve.weights_dir: weights come from trainer rank 0 only.
            cfg = ServeConfig(host=node_ip(), port=0, api_key=self.api_key, max_tokens=2**24, max_n=64)
            app = build_app(GatedEngine(self.engine, self._ready_event()), self.tokenizer, cfg)
            self.server = await serve_in_loop(app, cfg.host, 0, name=f"engine-{self.index}-server")
        return self.server[2]

    # ------------------------------------------------------------------ weights
    async def needs_weights(self) -> bool:
        """True for a restarted replica that has not been given the current weights yet."""
        return not self._ready_event().is_set()

    async def accept_initial(self) -> int:
        """No update has happened yet: the constructor's weights are current."""
        self._ready_event().set()
        return self.engine.policy_version

    async def join_weight_group(self, host: str, port: int, rank: int, world_size: int, backend: str) -> str:
        """Join the broadcast group of trainer rank 0 and the replicas."""
        self.transport = make_transport(backend)
        self.transport.join(host, port, rank, world_size, self.plan.runtime.collective_timeout, self.engine.device)
        return backend

    async def load_weights(self, payload: WeightPayload) -> int:
        """Serve the weights in `payload` from the next step on, at its policy version."""
        transport = self.transport if payload.transport == "broadcast" else make_transport(payload.transport)
        with transport.receive(payload) as weights:
            self.engine.load_weights({**weights, **payload.meta})  # meta: a LoRA adapter's config
        self.engine.policy_version = payload.version
        self._ready_event().set()
        return self.engine.policy_version

    # ------------------------------------------------------------------ state
    async def forget(self) -> None:
        """Drop what an evaluation left (cached prefixes, counters)."""
        forget_evaluation(self.engine)

    async def pop_metrics(self) -> dict[str, float]:
        """The engine's perf/engine_* counters."""
        return self.engine.pop_metrics()

    async def state(self, reset: bool = True) -> dict[str, Any]:
        """The engine's checkpoint state, cached prefixes dropped first (`reset`; an asynchronous
        run drops them between two batches of groups instead: rollout/stream.py)."""
        if reset:
            self.engine.reset_prefix_cache()
        return self.engine.state_dict()

    async def restore(self, state: dict[str, Any]) -> None:
        """Continue from `state`."""
        self.engine.load_state_dict(state)

    async def busy(self) -> bool:
        """Whether the engine holds a request (elastic.py removes a replica once it holds none)."""
        return self.engine.has_work()

    async def info(self) -> dict[str, Any]:
        """Where it runs and which policy it serves."""
        return {"node": node_id(), "version": self.engine.policy_version, "device": str(self.engine.device)}

    async def close(self) -> None:
        """End every request (and stop the HTTP server)."""
        self.engine.close()
        if self.server is not None:
            self.server[0].should_exit = True


class GatedEngine:
    """The engine as the replica's HTTP server sees it: generation waits until the replica serves
    the current weights (a restarted one, until trainer rank 0 has sent them)."""

    def __init__(self, engine: LocalEngine, ready: asyncio.Event) -> None:
        self.engine, self.ready = engine, ready

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Any:
        """The engine's completion of `prompt_ids`, once the replica is ready."""
        await self.ready.wait()
        return await self.engine.generate(prompt_ids, sampling)


def node_ip() -> str:
    """This node's IP as Ray knows it (loopback outside Ray)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
