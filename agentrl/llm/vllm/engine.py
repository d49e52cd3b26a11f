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
- **Probe**: `probe_gap(ids, logprobs)` scores fixed ids on every server and returns the largest
  difference from the trainer's logprobs of them, the check after each sync.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from agentrl.errors import EngineError
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.llm.remote.engine import RemoteEngine
from agentrl.llm.vllm.control import PAUSE_MODES, VllmControl
from agentrl.llm.vllm.launch import EXTENSION, TRANSPORT, VllmServer
from agentrl.llm.weights import save_file_atomic
from agentrl.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, is_adapter_state

KEEP_ADAPTERS = 2  # adapters loaded at once (vLLM's --max-loras): the newest and the one before, for replies in flight


class VllmEngine:
    """Generation on the vLLM servers at `urls` (their weights folder `weights_dir` is ours to write);
    `servers` are the processes this engine started and stops at close()."""

    def __init__(self, urls: list[str], weights_dir: str | Path, *, api_key: str | None = None,
                 pause_mode: str = "keep", seed: int = 0, timeout: float = 600.0, max_retries: int = 3,
                 servers: list[VllmServer] | None = None) -> None:
        if pause_mode not in PAUSE_MODES:
            raise EngineError(f"unknown pause mode {pause_mode!r}; known: {', '.join(PAUSE_MODES)}")
        self.remote = RemoteEngine(urls, "vllm", api_key=api_key, timeout=timeout, max_retries=max_retries, seed=seed)
        self.remote.wire.server_versions = True
        self.controls = [VllmControl(u, api_key, timeout) for u in self.remote.urls]
        self.weights_dir = Path(weights_dir)
        self.pause_mode = pause_mode
        self.servers = list(servers or [])
        self._adapters: list[str] = []
        self._push_seconds = 0.0
        for control in self.controls:
            try:
                backend = control.transfer_backend()
            except EngineError:
                backend = None
            if backend != TRANSPORT:
                raise EngineError(f"vLLM server {control.url} does not load agentrl's weight transport; start it with "
                                  f"--worker-extension-cls {EXTENSION} and --weight-transfer-config "
                                  f"'{{\"backend\": \"{TRANSPORT}\"}}', agentrl importable in its environment")
            control.set_weight_version("0")

    @classmethod
    def launch(cls, model: str | Path, workdir: str | Path, *, replicas: int = 1, python: str | None = None,
               args: list[str] | tuple[str, ...] = (), start_timeout: float = 900.0, lora_rank: int = 0,
               max_model_len: int | None = None, dtype: str = "float32", seed: int = 0,
               pause_mode: str = "keep") -> VllmEngine:
        """Start `replicas` servers of `model` (one after the other: a CPU has no room for two
        starting at once), wait for each, and return the engine that stops them at close()."""
        servers: list[VllmServer] = []
        key = secrets.token_urlsafe(24)  # one key for all: the client sends one
        try:
            for _ in range(replicas):
                server = VllmServer(model, workdir, python=python, args=args, api_key=key, lora_rank=lora_rank,
                                    max_model_len=max_model_len, dtype=dtype, seed=seed)
                servers.append(server)
                server.start()
                server.wait_ready(start_timeout)
            return cls([s.url for s in servers], servers[0].weights_dir, api_key=servers[0].api_key,
                       pause_mode=pause_mode, seed=seed, servers=servers)
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
        """Continue `prompt_ids` on the episode's server; the ids exactly as vLLM sampled them."""
        return await self.remote.generate(prompt_ids, sampling)

    def load_weights(self, state_dict: dict[str, Any]) -> int:
        """Push new weights (or a LoRA adapter state) to every server; return the new version."""
        version = self.policy_version + 1
        t0 = time.perf_counter()
        if is_adapter_state(state_dict):
            self._push_adapter(state_dict, version)
        else:
            path = save_file_atomic(state_dict, self.weights_dir / f"policy-v{version}.safetensors")
            for control in self.controls:
                control.sync(path.name, str(version), self.pause_mode)
            for old in self.weights_dir.glob("policy-v*.safetensors"):
                if old != path:
                    old.unlink(missing_ok=True)
        self.policy_version = version
        self._push_seconds += time.perf_counter() - t0
        return version

    def _push_adapter(self, state: dict[str, Any], version: int) -> None:
        """Write the adapter as a peft folder, load it everywhere as `policy-vN`, forget the oldest."""
        name = f"policy-v{version}"
        folder = self.weights_dir / name
        save_file_atomic({k: v for k, v in state.items() if k != ADAPTER_CONFIG}, folder / ADAPTER_WEIGHTS)
        (folder / "adapter_config.json").write_text(json.dumps(state[ADAPTER_CONFIG]))
        for control in self.controls:
            control.load_lora(name, str(folder.resolve()))
            control.set_weight_version(str(version))
        self.remote.wire.model = name
        self.remote.wire.server_versions = False  # an adapter is chosen per request: stamp at send
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
            served = control.score(ids, self.remote.wire.model)
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
        for control in self.controls:
            control.close()
        for server in self.servers:
            server.stop()
