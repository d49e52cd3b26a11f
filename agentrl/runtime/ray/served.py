"""Served engines on Ray (engine.kind=remote or vllm): generation on inference servers over HTTP,
as the local runtime does it, with the parts placed as Ray actors.

- **Which servers.** engine.kind=remote (and vllm with engine.urls): the servers of engine.urls;
  the run places no engine replica (its placement has no actor_infer). engine.kind=vllm without
  urls: each actor_infer replica is a `VllmReplicaActor` (runtime/ray/vllm_replica.py) that
  starts a vLLM server on what its placement bundle gives it.
- **Generation.** Each env manager holds its own client on those servers (`served_client`): a
  `RemoteEngine` in the config's protocol, seeded as the local run's engine is, or, on the run's
  vLLM replicas, an `HttpEngineClient` that learns a restarted server's new URL from its replica.
- **Weights.** Trainer rank 0 holds the engine the local runtime would build (`ServedEngine`, over
  runtime/assembly/engines.py `make_engine` or the vLLM engine of vllm_engine.py): version 0 first,
  then every update pushed by it, checked as locally (vLLM's probe); before each collection the
  env managers learn the version, which a client stamps on ids when its servers do not.
- **Restarts.** A vLLM replica whose server died is started again by rank 0's `VllmEngine`
  (runtime.max_restarts) and given the current weights before any env manager reaches it again.
"""

from __future__ import annotations

from typing import Any

from agentrl.llm.remote.engine import RemoteEngine
from agentrl.llm.remote.wire import VllmWire
from agentrl.rollout.source import forget_evaluation
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.ray.engine_http import HttpEngineClient
from agentrl.tokenizer import Tokenizer

CLIENT_KEYS = ("perf/remote_requests", "perf/remote_retries", "perf/remote_request_seconds")


def served_client(run_plan: RunPlan, handles: list[Any], names: list[str], api_key: str | None, index: int) -> Any:
    """The LLMClient of env manager `index`: on the run's vLLM replicas `handles`, else on engine.urls."""
    e, rt = run_plan.engine, run_plan.runtime
    seed = run_plan.seed + index  # manager 0 draws the local engine's stream (requests mostly bring their own)
    if handles:
        return HttpEngineClient(handles, names, api_key or "", rt.restart_timeout, e.request_timeout, seed=seed,
                                protocol="vllm")
    kind = run_plan.engine_kind
    remote = RemoteEngine(e.urls, kind.wire_protocol(e), api_key=run_plan.engine_key,
                          timeout=e.request_timeout, max_retries=e.max_retries, seed=seed)
    # Attached vLLM servers label their weights with our versions (VllmEngine); only vLLM's wire reads them.
    wire = remote.wire
    if kind.server_versions and isinstance(wire, VllmWire):
        wire.server_versions = True
    return remote


def build_served(run_plan: RunPlan, model: Any, tokenizer: Tokenizer, replicas: list[Any],
                 api_key: str | None) -> ServedEngine:
    """Rank 0's engine on the servers, serving `model`'s weights as version 0 (`replicas`: the run's
    vLLM replica actors, whose servers' key is `api_key`)."""
    if not replicas:  # engine.urls: the local runtime's own engine
        from agentrl.runtime.assembly.engines import make_engine

        return ServedEngine(make_engine(run_plan, model, tokenizer, next(model.parameters()).device), [])
    from agentrl.llm.vllm.engine import VllmEngine
    from agentrl.models.lora import is_peft
    from agentrl.runtime.assembly.vllm_engine import engine_options, with_initial_weights
    from agentrl.runtime.ray.vllm_replica import ReplicaServer, replica_weights_dir

    if is_peft(model):  # LoRA (trainer ranks wrap the policy): the probe runs the module with the adapters in it
        model = model.get_base_model()
    servers = [ReplicaServer.of(h, f"engine-{i}", run_plan.runtime.restart_timeout) for i, h in enumerate(replicas)]
    # A ReplicaServer is a VllmServer by duck typing (url, alive, replacement, start, stop): VllmEngine's
    # `servers` is annotated with the concrete class
    engine = VllmEngine([s.url for s in servers], replica_weights_dir(run_plan), api_key=api_key,
                        servers=servers,  # type: ignore[arg-type]
                        **engine_options(run_plan, model, tokenizer))
    return ServedEngine(with_initial_weights(engine, model), replicas)


class ServedEngine:
    """The servers' engine in trainer rank 0 (a RemoteEngine or VllmEngine): pushes, checkpoint
    state, metrics, and the restarts of the run's vLLM replicas."""

    def __init__(self, engine: Any, replicas: list[Any]) -> None:
        self.engine, self.replicas = engine, replicas
        self._epoch = 0  # restarts the engine reported so far

    @property
    def policy_version(self) -> int:
        """Version of the weights the servers serve."""
        return self.engine.policy_version

    def load_weights(self, weights: dict[str, Any], version: int) -> int:
        """Push `weights` as `version` to every server (a dead replica's server is restarted first)."""
        version = self.engine.load_weights(weights, version)
        self._open(self.replicas)  # every server now serves the pushed weights
        return version

    def request_model(self) -> str | None:
        """The model name requests must carry: the adapter the latest LoRA push loaded into vLLM
        (`policy-vN`, llm/vllm/engine.py), None for the served model itself."""
        remote = getattr(self.engine, "remote", self.engine)  # a VllmEngine's RemoteEngine, or the RemoteEngine
        wire = getattr(remote, "wire", None)
        return getattr(wire, "model", None)

    def heal(self) -> None:
        """Start again the vLLM servers that died, give them the current weights, then let the env
        managers reach them again."""
        restart = getattr(self.engine, "restart_dead", None)
        if restart is None or not self.replicas:
            return
        epoch = restart()
        if epoch != self._epoch:
            self._epoch = epoch
            self._open(self.replicas)

    def _open(self, replicas: list[Any]) -> None:
        import ray

        ray.get([h.mark_current.remote() for h in replicas])

    def forget(self) -> None:
        """Drop what an evaluation left in the servers (cached prefixes, counters)."""
        forget_evaluation(self.engine)

    def pop_metrics(self) -> dict[str, float]:
        """The engine's counters (the servers', its pushes, vLLM's probe gap), as the local run logs
        them; not its request counters: the env managers' clients make the requests."""
        return {k: v for k, v in self.engine.pop_metrics().items() if k not in CLIENT_KEYS}

    def state_dict(self) -> dict[str, Any]:
        """The engine's checkpoint state (cached prefixes dropped first, as locally)."""
        self.engine.reset_prefix_cache()
        return self.engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (the servers learn the version)."""
        self.engine.load_state_dict({k: v for k, v in state.items() if k != "replicas"})

    def close(self) -> None:
        """Close the connections, and stop the vLLM servers of the run's replicas."""
        self.engine.close()
