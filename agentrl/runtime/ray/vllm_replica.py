"""An engine replica of engine.kind=vllm on Ray: a Ray actor that starts one vLLM server
(llm/vllm/launch.py, engine.vllm.*) on what its placement bundle gives it (the GPUs Ray shows the
actor, or CPUs with the vLLM CPU build) and tells its URL.

The server listens on loopback when the cluster has one node, else on the node's IP (the env
managers may sit elsewhere; vLLM's key does not guard its RL routes, so the cluster's network
must be trusted, as Ray's own is). Its model is model.path, or the embedded policy the driver
wrote to RUN_DIR/vllm/model; its weights folder, shared with trainer rank 0, RUN_DIR/vllm/vllm-weights
(or engine.weights_dir).

Trainer rank 0 drives the servers through a `VllmEngine` whose servers are `ReplicaServer`s: it
finds a dead one, has its replica start it again (on a new port, runtime.max_restarts times at
most, as for a server of a local run) and gives it the current weights; only then does the
replica give its URL to env managers again (`http_url` waits meanwhile). A replica that Ray
itself restarted starts a fresh server and waits the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from agentrl.errors import EngineError
from agentrl.llm.vllm.launch import CPU_BUILD_ARGS, VllmServer, cpu_build, vllm_python
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.assembly.vllm_engine import SERVING_DIR, TRANSFERS
from agentrl.runtime.ray.engine_actor import node_ip, ready_gate, was_restarted
from agentrl.runtime.ray.engine_client import RESTART_POLL, check_restarting, first_line
from agentrl.runtime.ray.workers import SharedSpec, node_id, setup_worker


def replica_weights_dir(run_plan: RunPlan) -> Path:
    """The folder every replica's server loads pushed weights from (rank 0 writes them there)."""
    e = run_plan.engine
    return Path(e.weights_dir).expanduser() if e.weights_dir else Path(run_plan.run_dir) / SERVING_DIR / "vllm-weights"


def model_folder(run_plan: RunPlan) -> Path:
    """The model folder the servers start from: model.path, or where the driver writes the embedded policy."""
    m = run_plan.model
    return Path(m.path).expanduser() if m.path else Path(run_plan.run_dir) / SERVING_DIR / "model"


class VllmReplicaActor:
    """One vLLM server, started by the constructor (async methods: `http_url` may wait for rank 0)."""

    def __init__(self, shared: SharedSpec, index: int, seed: int, api_key: str) -> None:
        import ray

        run_plan = shared.get().plan
        setup_worker(run_plan.runtime.num_threads)
        m, v = run_plan.model, run_plan.engine.vllm
        python = vllm_python(v.python)[0]
        one_node = sum(bool(n.get("Alive")) for n in ray.nodes()) == 1
        self.index, self.restart_timeout = index, run_plan.runtime.restart_timeout
        self.server = VllmServer(model_folder(run_plan), Path(run_plan.run_dir) / SERVING_DIR / f"replica-{index}",
                                 python=python, args=[*(CPU_BUILD_ARGS if cpu_build(python) else ()), *v.args],
                                 host="127.0.0.1" if one_node else node_ip(), api_key=api_key,
                                 dtype=m.dtype, max_model_len=run_plan.rollout.max_model_len or None,
                                 lora_rank=m.lora.rank, seed=seed, weights_dir=replica_weights_dir(run_plan),
                                 transfer=TRANSFERS[v.weight_transfer])
        self.server.start()
        self.server.wait_ready(v.startup_timeout)
        self.restarted = was_restarted()  # a fresh server of a restarted replica serves only once rank 0 fed it
        self._current: asyncio.Event | None = None  # made in the actor's event loop

    def _gate(self) -> asyncio.Event:
        self._current = ready_gate(self._current, self.restarted)
        return self._current

    async def info(self) -> dict[str, Any]:
        """Where it runs, its server's URL and log."""
        return {"node": node_id(), "url": self.server.url, "log": str(self.server.log_path), "version": None}

    async def serving_url(self) -> str | None:
        """The server's URL while its process runs, else None (and env managers wait from now on)."""
        if self.server.alive():
            return self.server.url
        self._gate().clear()
        return None

    async def restart(self) -> tuple[str, str]:
        """(URL, log) of a running server: this one, or a new one on a new port when it died."""
        if not self.server.alive():
            self._gate().clear()
            fresh = self.server.replacement()
            self.server = fresh
            await asyncio.to_thread(fresh.start)
            await asyncio.to_thread(fresh.wait_ready, self.restart_timeout)
        return self.server.url, str(self.server.log_path)

    async def mark_current(self) -> None:
        """Rank 0 gave the server the current weights: env managers may reach it."""
        self._gate().set()

    async def http_url(self) -> str:
        """The server's URL for env managers, once it serves the current weights."""
        if not self.server.alive():
            self._gate().clear()
        await self._gate().wait()
        return self.server.url

    async def stop(self) -> None:
        """Stop the server and every process it started."""
        await asyncio.to_thread(self.server.stop)


class ReplicaServer:
    """A replica's vLLM server as `VllmEngine` restarts its servers (alive / replacement / start /
    wait_ready / url / log_path / stop), each call made on the replica actor."""

    def __init__(self, handle: Any, name: str, restart_timeout: float, url: str = "", log_path: str = "") -> None:
        self.handle, self.name, self.restart_timeout = handle, name, restart_timeout
        self.url, self.log_path = url, log_path

    @classmethod
    def of(cls, handle: Any, name: str, restart_timeout: float) -> ReplicaServer:
        """The server replica `handle` runs now."""
        import ray

        info = ray.get(handle.info.remote())
        return cls(handle, name, restart_timeout, info["url"], info["log"])

    def alive(self) -> bool:
        """Whether this server (this URL) still runs; a replica Ray restarted runs another."""
        import ray

        try:
            return ray.get(self.handle.serving_url.remote()) == self.url
        except ray.exceptions.RayActorError:
            return False

    def replacement(self) -> ReplicaServer:
        """The server the replica will run instead (known once started)."""
        return ReplicaServer(self.handle, self.name, self.restart_timeout, log_path=self.log_path)

    def start(self) -> None:
        """Have the replica start a server (waiting, up to restart_timeout, while Ray restarts the actor)."""
        import ray

        deadline = time.monotonic() + self.restart_timeout
        while True:
            try:
                self.url, self.log_path = ray.get(self.handle.restart.remote())
                return
            except ray.exceptions.RayActorError as e:
                check_restarting(e, self.name, self.restart_timeout, deadline)
                time.sleep(RESTART_POLL)
            except ray.exceptions.RayTaskError as e:  # the server failed to start: the replica's message
                cause = getattr(e, "cause", None)
                raise EngineError(f"{self.name}: {first_line(cause or e)}") from None

    def wait_ready(self, timeout: float) -> None:
        """`start` returned once the server answered."""

    def stop(self) -> None:
        """Stop the server (a replica already gone has taken it with it)."""
        import ray

        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self.handle.stop.remote(), timeout=60)
