"""The request schemas the server accepts, checked strictly, and how a request becomes
`SamplingParams`.

OpenAI's `/v1/chat/completions` and `/v1/completions` (with vLLM's extras `top_k` and
`return_token_ids`), vLLM's token-in/token-out `/inference/v1/generate` (`token_ids` +
`sampling_params`) and our own `/agentrl/generate` (every `SamplingParams` field). Types are
strict (a string is not a number, a float is not an int, NaN is not a number) and unknown
fields are ignored, as OpenAI clients send fields of newer API versions. A request that fails
gets a 400 naming the field (`RequestError`); features the engine does not have (penalties,
logit bias, JSON mode, echo) are refused by name rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.llm.engine import SamplingParams

INT64 = 2**63 - 1


class RequestError(Exception):
    """A request the server refuses: HTTP status, one-line message, the offending parameter, and
    whether the connection must close after the answer (its body was not read to the end)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, *,
                 close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.close = status, message, param, code, close


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class _Sampling(_Strict):
    """The decoding fields OpenAI's two routes share (plus vLLM's top_k)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=INT64)
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=INT64)
    n: int = Field(default=1, ge=1, le=INT64)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=INT64)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, Any] | None = None
    user: str | None = None


class ChatRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[Any]
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT64)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class VllmSampling(_Strict):
    """`sampling_params` of vLLM's /inference/v1/generate (the fields this engine has)."""

    max_tokens: int | None = Field(default=None, ge=1, le=INT64)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=INT64)
    n: int = Field(default=1, ge=1, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), le=INT64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)


class VllmGenerateRequest(_Strict):
    """POST /inference/v1/generate (vLLM's token-in/token-out route)."""

    token_ids: list[int] = Field(min_length=1)
    sampling_params: VllmSampling = Field(default_factory=VllmSampling)
    model: str | None = None
    request_id: str | None = None
    stream: bool = False


class AgentrlSampling(_Strict):
    """Every field of `SamplingParams`, as our own route takes them."""

    temperature: float = Field(default=1.0, gt=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=INT64)
    max_new_tokens: int = Field(default=16, ge=1, le=INT64)
    greedy: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = Field(default=None, ge=0, le=INT64)


class AgentrlGenerateRequest(_Strict):
    """POST /agentrl/generate."""

    prompt_ids: list[int] = Field(min_length=1)
    sampling: AgentrlSampling = Field(default_factory=AgentrlSampling)


class WeightsRequest(_Strict):
    """POST /agentrl/weights as JSON: a safetensors file in the server's serve.weights_dir, and the new version."""

    path: str
    version: int = Field(ge=0, le=INT64)


class StateRequest(_Strict):
    """POST /agentrl/state: set the policy version (a resumed run's)."""

    policy_version: int = Field(ge=0, le=INT64)


class RewardRequest(_Strict):
    """POST /sessions/<id>/reward."""

    reward: float


def parse(model: type[BaseModel], data: Any) -> Any:
    """`data` as `model`, or a RequestError naming the first bad field."""
    if not isinstance(data, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "body"
        got = repr(err.get("input"))[:60] if err["type"] != "missing" else ""
        raise RequestError(400, f"{where}: {err['msg']}" + (f" (got {got})" if got else ""), where) from None


@dataclass(frozen=True)
class RequestSampling:
    """What an OpenAI-style request asks of decoding, checked against the server's caps."""

    n: int = 1
    max_tokens: int | None = None  # None: the server's (or the session's) default
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    seed: int | None = None


def request_sampling(req: _Sampling, max_tokens_cap: int, max_n: int, max_tokens: int | None = None) -> RequestSampling:
    """The request's decoding, refusing what the engine cannot do or the caps do not allow."""
    if req.presence_penalty or req.frequency_penalty:
        raise RequestError(400, "presence_penalty and frequency_penalty are not supported by this engine; "
                                "leave them at 0", "presence_penalty")
    if req.logit_bias:
        raise RequestError(400, "logit_bias is not supported by this engine", "logit_bias")
    want = max_tokens if max_tokens is not None else req.max_tokens
    if want is not None and want > max_tokens_cap:
        raise RequestError(400, f"max_tokens={want} exceeds this server's limit of {max_tokens_cap} "
                                "(serve.max_tokens)", "max_tokens")
    if req.n > max_n:
        raise RequestError(400, f"n={req.n} exceeds this server's limit of {max_n} (serve.max_n)", "n")
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if len(stops) > 16 or any(not s or len(s) > 256 for s in stops):
        raise RequestError(400, "stop takes at most 16 non-empty strings of up to 256 characters", "stop")
    return RequestSampling(n=req.n, max_tokens=want, temperature=1.0 if req.temperature is None else req.temperature,
                           top_p=1.0 if req.top_p is None else req.top_p,
                           top_k=-1 if req.top_k in (None, 0) else req.top_k, stop=stops, seed=req.seed)


def sampling_params(rs: RequestSampling, default_max_tokens: int, eos_ids: tuple[int, ...]) -> list[SamplingParams]:
    """One `SamplingParams` per choice: temperature 0 is greedy; choice i of a seeded request
    gets seed + i (so the n choices differ and each is reproducible)."""
    out = []
    for i in range(rs.n):
        seed = None if rs.seed is None else (rs.seed + i) % (INT64 + 1)
        out.append(SamplingParams(temperature=rs.temperature if rs.temperature > 0 else 1.0, top_p=rs.top_p,
                                  top_k=rs.top_k, max_new_tokens=rs.max_tokens or default_max_tokens,
                                  greedy=rs.temperature == 0, stop_token_ids=tuple(eos_ids), stop=rs.stop, seed=seed))
    return out


def vllm_sampling(sp: VllmSampling, default_max_tokens: int, max_tokens_cap: int) -> SamplingParams:
    """`SamplingParams` of a vLLM /inference/v1/generate request."""
    if sp.max_tokens is not None and sp.max_tokens > max_tokens_cap:
        raise RequestError(400, f"sampling_params.max_tokens={sp.max_tokens} exceeds this server's limit of "
                                f"{max_tokens_cap} (serve.max_tokens)", "sampling_params.max_tokens")
    stops = (sp.stop,) if isinstance(sp.stop, str) else tuple(sp.stop or ())
    return SamplingParams(temperature=sp.temperature if sp.temperature > 0 else 1.0, top_p=sp.top_p,
                          top_k=-1 if sp.top_k == 0 else sp.top_k, max_new_tokens=sp.max_tokens or default_max_tokens,
                          greedy=sp.temperature == 0, stop_token_ids=tuple(sp.stop_token_ids or ()), stop=stops,
                          seed=None if sp.seed is None else sp.seed % (INT64 + 1))


def agentrl_sampling(sp: AgentrlSampling, max_tokens_cap: int) -> SamplingParams:
    """`SamplingParams` of an /agentrl/generate request (every field as given)."""
    if sp.max_new_tokens > max_tokens_cap:
        raise RequestError(400, f"sampling.max_new_tokens={sp.max_new_tokens} exceeds this server's limit of "
                                f"{max_tokens_cap} (serve.max_tokens)", "sampling.max_new_tokens")
    return SamplingParams(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, max_new_tokens=sp.max_new_tokens,
                          greedy=sp.greedy, stop_token_ids=tuple(sp.stop_token_ids), stop=tuple(sp.stop), seed=sp.seed)


def refuse_unsupported(req: ChatRequest | CompletionRequest) -> None:
    """400 for the OpenAI features this server does not implement (never silently ignored)."""
    if isinstance(req, ChatRequest):
        kind = (req.response_format or {}).get("type", "text")
        if kind != "text":
            raise RequestError(400, f"response_format type {kind!r} is not supported (only text)", "response_format")
    else:
        if req.echo:
            raise RequestError(400, "echo=true is not supported", "echo")
        if req.best_of not in (None, 1) and req.best_of != req.n:
            raise RequestError(400, "best_of is not supported (use n)", "best_of")
        if req.suffix:
            raise RequestError(400, "suffix is not supported", "suffix")
