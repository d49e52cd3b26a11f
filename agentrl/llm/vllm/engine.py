"""`VllmEngine`: the `InferenceEngine` contract on vLLM servers, ours (started here) or running ones.

- **Generation** is `RemoteEngine`'s, in the `vllm` wire format (llm/remote/wire.py): token ids
  in, token ids and logprobs out on /inference/v1/generate, sticky routing per episode, seeds
  from our stream, retries. Every push labels vLLM's weights with our version number, so each
  id comes back with the version that sampled it (vLLM's `weight_versions` spans).
- **Weights** go through vLLM's RL routes, never a restart: the full state dict is written as
  one safetensors file to the servers' weights folder (shared: the servers run on this machine)
  and each server pauses (`pause_mode`), loads it with our transport (transfer.py), takes the
  version label, drops its cached prefixes and resumes. With `pause_mode="keep"` replies in flight
  continue under the new weights (partial rollout): their ids carry two versions and
  `Completion.kv_version` the oldest. A LoRA adapter state is written as a peft folder and loaded
  with /v1/load_lora_adapter under the name `policy-vN`; requests sent after it use it, replies
  in flight finish with the adapter they started with, and are stamped with the version of
  their start.
- **Restart**: a server this engine started that died (its process exited) is started again
  on a new port (`restart_timeout` to come up, `max_restarts` times at most), given the newest
  weights (and adapters) and version label, and the requests that failed on it are sent again:
  same prompt, same seed, so the episode goes on token-exact. Counted in perf/vllm_restarts and
  perf/vllm_replayed_requests.
- **Probe**: after every push each server must report the new version label and score fixed ids
  (`probe_ids`) within `probe_tolerance` of the trainer's logprobs of them (`probe`, a function
  the run gives: the policy's own forward pass); else the push ends in one EngineError naming
  engine.vllm.probe_tolerance. `policy/engine_probe_diff` logs the gap of the last push.
- **NCCL** (`transfer="nccl"`, GPUs): full weights are broadcast from the trainer's GPU into the
  servers' workers through vLLM's own NCCL engine instead of a file (nccl.py); the group is
  formed at the first push and again after a restart (with the newest pushed tensors sent then).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrl.errors import EngineError
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.llm.remote.engine import RemoteEngine
from agentrl.llm.remote.wire import VllmWire
from agentrl.llm.vllm.control import PAUSE_MODES, VllmControl
from agentrl.llm.vllm.launch import CPU_BUILD_ARGS, EXTENSION, TRANSPORT, TRANSPORTS, VllmServer, cpu_build, vllm_python
from agentrl.llm.vllm.nccl import NcclSender
from agentrl.llm.weights import save_file_atomic
from agentrl.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, is_adapter_state
from agentrl.tokenizer import Tokenizer

KEEP_ADAPTERS = 2  # adapters loaded at once (vLLM's --max-loras): the newest and the one before, for replies in flight
# The probe's text: words, digits, tags and punctuation, so that it crosses common and rare ids alike
PROBE_TEXT = ("The agent reads the board and answers: <answer>Left</answer>. Row 3, column 2: 'F', 'H', 'G'. "
              "Then 17 + 25 = 42; (x - 1) * 2 -> ok? Yes!")
PROBE_MAX_IDS = 64


def probe_ids(tokenizer: Tokenizer) -> list[int]:
    """The fixed ids every server scores after a push: PROBE_TEXT's, at most PROBE_MAX_IDS."""
    ids = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))[:PROBE_MAX_IDS]
    if len(ids) < 2:
        raise EngineError(f"the tokenizer gives the probe text {len(ids)} id(s); the probe needs at least 2")
    return ids


class VllmEngine:
    """Generation on the vLLM servers at `urls` (their weights folder `weights_dir` is ours to write);
    `servers` are the processes this engine started and stops at close()."""

    def __init__(self, urls: list[str], weights_dir: str | Path, *, api_key: str | None = None,
                 pause_mode: str = "keep", seed: int = 0, timeout: float = 600.0, max_retries: int = 3,
                 servers: list[VllmServer] | None = None, probe: Callable[[list[int]], list[float]] | None = None,
                 probe_ids: list[int] | None = None, probe_tolerance: float = 1e-3,
                 restart_timeout: float = 120.0, max_restarts: int = 3, transfer: str = TRANSPORT) -> None:
        if pause_mode not in PAUSE_MODES:
            raise EngineError(f"unknown pause mode {pause_mode!r}; known: {', '.join(PAUSE_MODES)}")
        if probe is not None and (probe_ids is None or len(probe_ids) < 2):
            raise EngineError("a probe needs probe_ids: at least 2 ids to score")
        self.remote = RemoteEngine(urls, "vllm", api_key=api_key, timeout=timeout, max_retries=max_retries, seed=seed)
        wire = self.remote.wire
        assert isinstance(wire, VllmWire)  # the wire of protocol "vllm"
        self.wire = wire  # the remote's own: the adapter to request and whether to read version labels
        self.wire.server_versions = True
        self.controls = [VllmControl(u, api_key, timeout) for u in self.remote.urls]
        self.weights_dir = Path(weights_dir)
        self.pause_mode = pause_mode
        self.servers = list(servers or [])
        self.probe, self.probe_ids, self.probe_tolerance = probe, list(probe_ids or []), probe_tolerance
        self.api_key, self.timeout = api_key, timeout
        self.restart_timeout, self.max_restarts = restart_timeout, max_restarts
        self._adapters: list[str] = []
        self._weights_file: str | None = None  # the newest full weights pushed, what a restarted server loads
        self._push_seconds = 0.0
        self._probe_diff: float | None = None
        self._restart_lock = threading.Lock()
        self._restarts = [0] * len(self.servers)
        self._epoch = 0  # restarts so far, of every server
        self._counts = {"restarts": 0, "replayed": 0}
        if transfer not in TRANSPORTS:
            raise EngineError(f"unknown weight transport {transfer!r}; known: {', '.join(TRANSPORTS)}")
        for control in self.controls:
            try:
                backend = control.transfer_backend()
            except EngineError:
                backend = None
            if backend != transfer:
                raise EngineError(f"vLLM server {control.url} does not load the weight transport {transfer!r} "
                                  f"(it reports {backend!r}); start it with --worker-extension-cls {EXTENSION} and "
                                  f"--weight-transfer-config '{{\"backend\": \"{transfer}\"}}', agentrl importable "
                                  "in its environment")
            control.set_weight_version("0")
        self._nccl = NcclSender(self.controls) if transfer == "nccl" else None
        self._nccl_state: dict[str, Any] | None = None  # the newest tensors broadcast: what a restarted server gets

    @classmethod
    def launch(cls, model: str | Path, workdir: str | Path, *, replicas: int = 1, python: str | None = None,
               args: list[str] | tuple[str, ...] = (), start_timeout: float = 900.0, lora_rank: int = 0,
               max_model_len: int | None = None, dtype: str = "float32", seed: int = 0,
               weights_dir: str | Path | None = None, transfer: str = TRANSPORT, **engine: Any) -> VllmEngine:
        """Start `replicas` servers of `model` (one after the other: a CPU has no room for two
        starting at once), wait for each, and return the engine (`engine`: its other arguments)
        that stops them at close()."""
        servers: list[VllmServer] = []
        key = secrets.token_urlsafe(24)  # one key for all: the client sends one
        python = python or vllm_python()[0]
        args = [*(CPU_BUILD_ARGS if cpu_build(python) else ()), *args]  # the user's come last and win
        try:
            for _ in range(replicas):
                server = VllmServer(model, workdir, python=python, args=args, api_key=key, lora_rank=lora_rank,
                                    max_model_len=max_model_len, dtype=dtype, seed=seed, weights_dir=weights_dir,
                                    transfer=transfer)
                servers.append(server)
                server.start()
                server.wait_ready(start_timeout)
            return cls([s.url for s in servers], servers[0].weights_dir, api_key=key, seed=seed, servers=servers,
                       transfer=transfer, **engine)
        except BaseException:
            for server in servers:
                server.stop()
            raise

    @property
    def policy_version(self) -> int:
        """Version of the weights served (each load_weights adds one)."""
        return self.remote.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        self.remote.policy_version = value

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Continue `prompt_ids` on the episode's server; the ids exactly as vLLM sampled them. A
        request that failed because a server of ours died is sent again once it is restarted."""
        if sampling.seed is None:  # drawn once: a replayed request samples the same ids
            sampling = replace(sampling, seed=self.remote.next_seed())
        epoch = self._epoch
        try:
            return await self.remote.generate(prompt_ids, sampling)
        except EngineError:
            if not self.servers or await asyncio.to_thread(self.restart_dead) == epoch:
                raise  # no server of ours was restarted since the request went out
        self._counts["replayed"] += 1
        return await self.remote.generate(prompt_ids, sampling)

    def restart_dead(self) -> int:
        """Start again every server of ours whose process exited, with the newest weights; returns
        the count of restarts so far (the requests failing at once wait for one restart)."""
        with self._restart_lock:
            for i, server in enumerate(self.servers):
                if server.alive():
                    continue
                if self._restarts[i] >= self.max_restarts:
                    raise EngineError(f"the vLLM server {server.url} died and was restarted {self._restarts[i]} "
                                      f"time(s) already (runtime.max_restarts); see its log {server.log_path}")
                fresh = server.replacement()
                fresh.start()
                fresh.wait_ready(self.restart_timeout)
                control = VllmControl(fresh.url, self.api_key, self.timeout)
                if self._nccl is None:
                    self._load_current(control)
                self.servers[i], self.controls[i] = fresh, control
                self.remote.set_url(i, fresh.url)
                self._restarts[i] += 1
                self._counts["restarts"] += 1
                self._epoch += 1
                if self._nccl is not None:  # an NCCL group cannot grow: form it again, with every server
                    self._nccl.connect()
                    if self._nccl_state is not None:
                        self._broadcast(self._nccl_state, self.policy_version, "wait")
                    self._load_current(control)  # its adapters and label (no weights file under NCCL)
            return self._epoch

    def _load_current(self, control: VllmControl) -> None:
        """Give a restarted server what the others serve: the newest full weights, the adapters
        in use, the version label."""
        if self._weights_file is not None:
            control.sync(self._weights_file, str(self.policy_version), "wait")
        for name in self._adapters:
            control.load_lora(name, str((self.weights_dir / name).resolve()))
        control.set_weight_version(str(self.policy_version))

    def load_weights(self, state_dict: dict[str, Any], version: int | None = None) -> int:
        """Push new weights (or a LoRA adapter state) to every server and check them on the probe;
        return the new version (`version`, or the current one plus one)."""
        version = self.policy_version + 1 if version is None else version
        self.restart_dead()  # a server that died between two syncs gets the push too
        t0 = time.perf_counter()
        if is_adapter_state(state_dict):
            self._push_adapter(state_dict, version)
        elif self._nccl is not None:
            self._broadcast(state_dict, version, self.pause_mode)
        else:
            path = save_file_atomic(state_dict, self.weights_dir / f"policy-v{version}.safetensors")
            for control in self.controls:
                control.sync(path.name, str(version), self.pause_mode)
            self._weights_file = path.name
            for old in self.weights_dir.glob("policy-v*.safetensors"):
                if old != path:
                    old.unlink(missing_ok=True)
        self.policy_version = version
        self._push_seconds += time.perf_counter() - t0
        if self.probe is not None:
            self.check_probe(version)
        return version

    def _broadcast(self, state: dict[str, Any], version: int, mode: str) -> None:
        """Pause every server, broadcast `state` over NCCL labelled `version`, drop cached prefixes,
        resume (resumed even on failure)."""
        assert self._nccl is not None
        for control in self.controls:
            control.pause(mode)
        try:
            self._nccl.send(state, str(version))
            self._nccl_state = state
            for control in self.controls:
                control.reset_prefix_cache()
        finally:
            for control in self.controls:
                control.resume()

    def check_probe(self, version: int) -> float:
        """After a push: every server labels its weights `version` and scores the probe within
        probe_tolerance of the trainer (one-line EngineError otherwise); returns the largest gap."""
        assert self.probe is not None, "check_probe needs the probe the run gave"
        mine = self.probe(self.probe_ids)
        worst = 0.0
        for control in self.controls:
            label = control.weight_version()
            if label != str(version):
                raise EngineError(f"vLLM server {control.url} reports weights version {label!r} after the push of "
                                  f"version {version}: another client changed its weights")
            served = control.score(self.probe_ids, self.wire.model)
            gap = max(abs(a - b) for a, b in zip(served, mine))
            if not gap <= self.probe_tolerance:  # NaN fails too
                raise EngineError(f"vLLM server {control.url} scores the probe up to {gap:.3g} nats away from the "
                                  f"trainer after the push of version {version}, beyond engine.vllm.probe_tolerance="
                                  f"{self.probe_tolerance:g} (weights that did not arrive, or another model or dtype "
                                  "served); raise the tolerance only for a known numeric difference")
            worst = max(worst, gap)
        self._probe_diff = worst
        return worst

    def _push_adapter(self, state: dict[str, Any], version: int) -> None:
        """Write the adapter as a peft folder, load it everywhere as `policy-vN`, forget the oldest."""
        name = f"policy-v{version}"
        folder = self.weights_dir / name
        save_file_atomic({k: v for k, v in state.items() if k != ADAPTER_CONFIG}, folder / ADAPTER_WEIGHTS)
        (folder / "adapter_config.json").write_text(json.dumps(state[ADAPTER_CONFIG]))
        for control in self.controls:
            control.load_lora(name, str(folder.resolve()))
            control.set_weight_version(str(version))
        self.wire.model = name
        self.wire.server_versions = False  # an adapter is chosen per request: stamp at send
        self._adapters.append(name)
        while len(self._adapters) > KEEP_ADAPTERS:
            old = self._adapters.pop(0)
            for control in self.controls:
                control.unload_lora(old)
            shutil.rmtree(self.weights_dir / old, ignore_errors=True)

    def probe_gap(self, ids: list[int], trainer_logprobs: list[float]) -> float:
        """The largest |served - trainer| logprob of ids[1:] given their prefixes, over every server."""
        if len(trainer_logprobs) != len(ids) - 1:
            raise EngineError(f"probe: {len(ids) - 1} positions to score but {len(trainer_logprobs)} trainer logprobs")
        gap = 0.0
        for control in self.controls:
            served = control.score(ids, self.wire.model)
            gap = max([gap] + [abs(a - b) for a, b in zip(served, trainer_logprobs)])
        return gap

    def reset_prefix_cache(self) -> bool:
        """Drop every server's cached prefixes; False if any still holds blocks (requests running)."""
        return all([control.reset_prefix_cache() for control in self.controls])

    def pop_metrics(self) -> dict[str, float]:
        """perf/remote_* of the client, and the seconds spent pushing weights."""
        out = self.remote.pop_metrics()
        out["perf/remote_weight_push_seconds"] = self._push_seconds
        self._push_seconds = 0.0
        if self._probe_diff is not None:
            out["policy/engine_probe_diff"] = self._probe_diff
            self._probe_diff = None
        if self.servers:
            out["perf/vllm_restarts"] = float(self._counts["restarts"])
            out["perf/vllm_replayed_requests"] = float(self._counts["replayed"])
            self._counts = {"restarts": 0, "replayed": 0}
        return out

    def state_dict(self) -> dict[str, Any]:
        """Policy version and the seed stream."""
        return self.remote.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned, and label the servers' weights with the version."""
        self.remote.load_state_dict(state)
        for control in self.controls:
            control.set_weight_version(str(self.policy_version))

    def close(self) -> None:
        """Close the connections and stop the servers this engine started."""
        self.remote.close()
        if self._nccl is not None:
            self._nccl.close()
        for control in self.controls:
            control.close()
        for server in self.servers:
            server.stop()
