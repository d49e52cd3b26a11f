"""The wire formats `RemoteEngine` speaks: one small adapter per server kind.

- `agentrl` (`agentrl serve`, tested): /agentrl/generate carries every SamplingParams field and
  returns the server's per-id policy versions; weights go to /agentrl/weights (a LoRA run's adapter
  to /agentrl/adapter) as a safetensors body or a path on a shared disk; prefix reset, metrics and
  the version have routes of their own.
- `vllm` (run against vLLM 0.32's CPU build: llm/vllm/ and its tests): /inference/v1/generate
  (served with `--enable-scale-out`) with `token_ids` + `sampling_params` (`logprobs: 0` for the
  sampled token's logprob) returns `choices[0].token_ids`, `choices[0].logprobs.content[].logprob`
  and `choices[0].weight_versions`, spans of output ids each sampled under one weights label.
  New weights are written as an HF folder to engine.weights_dir (the folder the server was
  started with) and reloaded through `/collective_rpc` method `reload_weights` (vLLM's dev-mode
  routes, VLLM_SERVER_DEV_MODE=1), then `/reset_prefix_cache`; `VllmEngine` (llm/vllm/engine.py)
  pushes through vLLM's weight-transfer routes instead. Start vLLM with
  `--logprobs-mode processed_logprobs`, so logprobs are of the temperature-scaled distribution
  the trainer recomputes (with top_p < 1 or top_k on they are of the filtered, renormalised
  distribution, which the trainer does not recompute).
- `sglang` (written against SGLang's documented schema, not run here): /generate with
  `input_ids`, `sampling_params` (`sampling_seed`) and `return_logprob: true` returns
  `meta_info.output_token_logprobs` as (logprob, id, text) and `meta_info.finish_reason`; new
  weights through `/update_weights_from_disk` {model_path}; `/flush_cache` drops the prefixes.

SGLang does not stamp ids with a policy version: the client stamps each with the version it had
pushed when the request was sent. vLLM does when told to trust it (`VllmWire.server_versions`,
set by `VllmEngine`, which labels every push with our version number): a reply that spans a
weight update then carries the version of each id.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from agentrl.errors import EngineError
from agentrl.llm.engine import Completion, FinishReason, SamplingParams


class Wire(Protocol):
    """What `RemoteEngine` reads and calls on a wire format: its routes and its bodies."""

    name: str  # the engine.protocol value that picks it
    health: str
    generate_path: str
    reset_path: str

    def generate_body(self, prompt: list[int], s: SamplingParams) -> dict[str, Any]:
        """The request body of one generation."""

    def completion(self, data: dict[str, Any], version: int) -> Completion:
        """The Completion in a response body (`version`: the one pushed when it was sent)."""

    def reset_ok(self, status: int, data: Any) -> bool:
        """Whether a prefix-cache reset response says the prefixes were dropped."""


@runtime_checkable
class FolderWire(Wire, Protocol):
    """A wire whose servers load new weights from a model folder (vLLM, SGLang)."""

    def reload(self, folder: str) -> list[tuple[str, dict[str, Any]]]:
        """(route, JSON body) calls that make a server serve the weights written to `folder`."""


def _finish(reason: Any) -> FinishReason:
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return kind if kind in ("stop", "length", "abort") else "stop"


class AgentrlWire:
    """`agentrl serve`'s routes."""

    name = "agentrl"
    health = "/health"
    generate_path = "/agentrl/generate"
    reset_path = "/agentrl/reset_prefix_cache"
    stamps_versions = True  # the server reports each id's version

    def generate_body(self, prompt: list[int], s: SamplingParams) -> dict[str, Any]:
        """The request body of one generation."""
        return {"prompt_ids": prompt, "sampling": {
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "max_new_tokens": s.max_new_tokens,
            "greedy": s.greedy, "stop_token_ids": list(s.stop_token_ids), "stop": list(s.stop), "seed": s.seed}}

    def completion(self, data: dict[str, Any], version: int) -> Completion:
        """The Completion in a response body."""
        ids = data["token_ids"]
        return Completion(list(ids), [float(x) for x in data["logprobs"]], _finish(data["finish_reason"]),
                          int(data.get("policy_version", version)), list(data.get("versions") or [version] * len(ids)),
                          stop_reason=data.get("stop_reason"), kv_version=data.get("kv_version"))

    def reset_ok(self, status: int, data: Any) -> bool:
        """Whether a reset response says the prefixes were dropped."""
        return status == 200 and bool(isinstance(data, dict) and data.get("reset"))


class VllmWire:
    """vLLM's token-in/token-out route and its dev-mode control routes."""

    name = "vllm"
    health = "/health"
    generate_path = "/inference/v1/generate"
    reset_path = "/reset_prefix_cache"
    stamps_versions = False

    def __init__(self) -> None:
        self.model: str | None = None  # a LoRA adapter's name: requests then generate with it
        self.server_versions = False  # the server's weight labels are our version numbers: read them

    def generate_body(self, prompt: list[int], s: SamplingParams) -> dict[str, Any]:
        """vLLM's GenerateRequest (temperature 0 is greedy; top_k 0 is off)."""
        body: dict[str, Any] = {"token_ids": prompt, "sampling_params": {
            "max_tokens": s.max_new_tokens, "temperature": 0.0 if s.greedy else s.temperature, "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else 0, "seed": s.seed, "stop": list(s.stop),
            "stop_token_ids": list(s.stop_token_ids), "logprobs": 0, "detokenize": bool(s.stop)}}
        if self.model:
            body["model"] = self.model
        return body

    def completion(self, data: dict[str, Any], version: int) -> Completion:
        """choices[0].token_ids, the sampled tokens' logprobs and (server_versions) each id's version."""
        choice = data["choices"][0]
        ids = list(choice["token_ids"])
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(ids):
            raise EngineError(f"vLLM returned {len(ids)} token ids but {len(content)} logprobs: start the request "
                              "with logprobs=0 (this client does) on a vLLM with /inference/v1/generate")
        versions = [version] * len(ids)
        spans = choice.get("weight_versions") if self.server_versions else None
        if spans:
            versions = span_versions(spans, len(ids))
        return Completion(ids, [float(c["logprob"]) for c in content], _finish(choice.get("finish_reason")),
                          versions[-1] if versions else version, versions, stop_reason=choice.get("stop_reason"),
                          kv_version=min(versions) if spans else None)

    def reset_ok(self, status: int, data: Any) -> bool:
        """vLLM answers 200 once the prefix cache is reset."""
        return status == 200

    def reload(self, folder: str) -> list[tuple[str, dict[str, Any]]]:
        """The calls that make a vLLM server serve the weights written to `folder`."""
        return [("/collective_rpc", {"method": "reload_weights"}), ("/reset_prefix_cache", {})]


def span_versions(spans: list[dict[str, Any]], n: int) -> list[int]:
    """Per-id versions from vLLM's `weight_versions` spans ({version, start, end} over output ids)."""
    versions: list[int | None] = [None] * n
    for span in spans:
        try:
            label = int(span["version"])
        except ValueError:
            raise EngineError(f"vLLM labelled ids with weights version {span['version']!r}, not a number of ours: "
                              "was the server's weight version set by another client?") from None
        versions[int(span["start"]):int(span["end"])] = [label] * (int(span["end"]) - int(span["start"]))
    if any(v is None for v in versions):
        raise EngineError(f"vLLM's weight_versions spans {spans} do not cover its {n} ids")
    return versions  # type: ignore[return-value]  # every None was refused just above


class SglangWire:
    """SGLang's native routes."""

    name = "sglang"
    health = "/health"
    generate_path = "/generate"
    reset_path = "/flush_cache"
    stamps_versions = False

    def generate_body(self, prompt: list[int], s: SamplingParams) -> dict[str, Any]:
        """SGLang's GenerateReqInput (temperature 0 is greedy; top_k -1 is off)."""
        params: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "temperature": 0.0 if s.greedy else s.temperature,
                                  "top_p": s.top_p, "top_k": s.top_k if s.top_k > 0 else -1,
                                  "stop": list(s.stop), "stop_token_ids": list(s.stop_token_ids)}
        if s.seed is not None:
            params["sampling_seed"] = s.seed
        return {"input_ids": prompt, "sampling_params": params, "return_logprob": True, "stream": False}

    def completion(self, data: dict[str, Any], version: int) -> Completion:
        """meta_info.output_token_logprobs: (logprob, id, text) per generated id."""
        if isinstance(data, list):  # a batch answer to one prompt
            data = data[0]
        meta = data.get("meta_info") or {}
        rows = meta.get("output_token_logprobs") or []
        ids = [int(r[1]) for r in rows]
        if "output_ids" in data and list(data["output_ids"])[-len(ids):] != ids:
            raise EngineError("SGLang's output_ids and output_token_logprobs disagree")
        return Completion(ids, [float(r[0]) for r in rows], _finish(meta.get("finish_reason")), version,
                          [version] * len(ids))

    def reset_ok(self, status: int, data: Any) -> bool:
        """SGLang flushes only when idle (400 otherwise)."""
        return status == 200

    def reload(self, folder: str) -> list[tuple[str, dict[str, Any]]]:
        """The call that makes an SGLang server load the weights written to `folder`."""
        return [("/update_weights_from_disk", {"model_path": folder})]


WIRES: dict[str, type[Wire]] = {"agentrl": AgentrlWire, "vllm": VllmWire, "sglang": SglangWire}
