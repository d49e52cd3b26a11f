"""vLLM's RL routes on one server, as plain calls (the server runs with VLLM_SERVER_DEV_MODE=1).

Request and response shapes, as vLLM 0.32 answers them:
- `POST /pause?mode=abort|wait|keep` -> `{"status": "paused"}`: abort ends requests in flight
  (they return what they had, finish_reason "abort"); wait lets them finish; keep freezes them
  with their KV cache until `/resume`. A request sent while paused waits for `/resume`.
- `POST /resume` -> `{"status": "resumed"}`; `GET /is_paused` -> `{"is_paused": bool}`.
- `POST /init_weight_transfer_engine {"init_info": {...}}`, `/start_weight_update`,
  `/update_weights {"update_info": {...}}`, `/finish_weight_update {"weight_version": "N"}`:
  each `{"message": ...}`; a worker error is a 500 whose message ends "please check the stack
  trace above". Between start and finish the model is mid-reload: generation must be paused.
- `POST /update_weight_version {"new_version": "N"}`; `GET /weight_info` -> `{"weight_version": "N"}`
  (the label `/inference/v1/generate` puts on the ids it samples from then on).
- `POST /reset_prefix_cache` -> `{"success": bool}`.
- `POST /collective_rpc {"method": m, "args": [str], "kwargs": {str: str}}` -> `{"results": [...]}`.
- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` (VLLM_ALLOW_RUNTIME_LORA_UPDATING=1) -> 200,
  text; then requests with `"model": lora_name` generate with the adapter.
vLLM's --api-key guards /v1 and /inference only; the key is sent everywhere anyway.
"""

from __future__ import annotations

from typing import Any

import httpx

from agentrl.errors import EngineError
from agentrl.llm.remote.engine import error_message, nodelay_transport

PAUSE_MODES = ("abort", "wait", "keep")


class VllmControl:
    """The RL routes of the vLLM server at `url`."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers, transport=nodelay_transport())

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of one route (None for an empty body); EngineError in one line otherwise."""
        for attempt in range(2):
            try:
                resp = self.http.request(method, self.url + path, **kwargs)
                break
            except httpx.TransportError as e:
                # After a route raised (a 500 from a worker error), vLLM's server closes that
                # keep-alive connection: the next call on it is reset before it is read. Once more.
                if attempt:
                    raise EngineError(f"vLLM server {self.url} is not answering {path} "
                                      f"({type(e).__name__}: {e})") from None
        if resp.status_code == 404 and "json" not in resp.headers.get("content-type", ""):
            raise EngineError(f"vLLM server {self.url} has no route {path}: start it with VLLM_SERVER_DEV_MODE=1 "
                              "(and --enable-scale-out for /inference/v1/generate)")
        if resp.status_code >= 400:
            message = error_message(resp).split(", please check the stack trace")[0]
            raise EngineError(f"vLLM server {self.url} refused {path} (HTTP {resp.status_code}): {message}")
        try:
            return resp.json()
        except ValueError:
            return resp.text or None

    def pause(self, mode: str = "keep") -> None:
        """Stop scheduling: `abort` ends requests in flight, `wait` lets them finish, `keep` freezes them."""
        if mode not in PAUSE_MODES:
            raise EngineError(f"unknown pause mode {mode!r}; known: {', '.join(PAUSE_MODES)}")
        self.call("POST", "/pause", params={"mode": mode})

    def resume(self) -> None:
        """Schedule again (frozen requests continue)."""
        self.call("POST", "/resume")

    def is_paused(self) -> bool:
        """Whether the server is paused."""
        return bool(self.call("GET", "/is_paused")["is_paused"])

    def weight_version(self) -> str:
        """The label of the weights the server serves ("default" until one is set)."""
        return str(self.call("GET", "/weight_info")["weight_version"])

    def set_weight_version(self, version: str) -> None:
        """Label the weights served from now on."""
        self.call("POST", "/update_weight_version", json={"new_version": str(version)})

    def transfer_backend(self) -> str:
        """The weight transport the worker extension registered (EngineError if it is not loaded)."""
        return str(self.call("POST", "/collective_rpc", json={"method": "agentrl_transfer_backend"})["results"][0])

    def push_file(self, path: str, version: str) -> None:
        """Load the safetensors file `path` (in the server's weights folder) through the four weight
        routes and label it `version`; the caller has paused generation."""
        self.call("POST", "/init_weight_transfer_engine", json={"init_info": {}})
        self.call("POST", "/start_weight_update")
        self.call("POST", "/update_weights", json={"update_info": {"path": path}})
        self.call("POST", "/finish_weight_update", json={"weight_version": str(version)})

    def sync(self, path: str, version: str, mode: str = "keep") -> None:
        """Pause, load `path` labelled `version`, drop cached prefixes, resume (resumed even on failure)."""
        self.pause(mode)
        try:
            self.push_file(path, version)
            self.reset_prefix_cache()
        finally:
            self.resume()

    def reset_prefix_cache(self) -> bool:
        """Drop cached prefixes; False while blocks are held (requests running)."""
        return bool(self.call("POST", "/reset_prefix_cache").get("success"))

    def load_lora(self, name: str, path: str) -> None:
        """Load the peft adapter folder `path` as `name` (requests with model=name use it)."""
        self.call("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})

    def unload_lora(self, name: str) -> None:
        """Forget the adapter `name`."""
        self.call("POST", "/v1/unload_lora_adapter", json={"lora_name": name})

    def score(self, ids: list[int], model: str | None = None) -> list[float]:
        """log p(ids[i] | ids[:i]) at temperature 1 for i >= 1, as the server computes them (prompt logprobs)."""
        body: dict[str, Any] = {"token_ids": list(ids), "sampling_params": {
            "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}}
        if model:
            body["model"] = model
        rows = self.call("POST", "/inference/v1/generate", json=body)["prompt_logprobs"]
        return [float(row[str(t)]["logprob"]) for t, row in zip(ids[1:], rows[1:])]

    def close(self) -> None:
        """Close the connections."""
        self.http.close()
