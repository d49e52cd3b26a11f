"""The engine section of the experiment schema (`engine.*`): where generation runs (this process,
or inference servers over HTTP) and the in-process engine's knobs, with vLLM's and SGLang's names.
Part of `agentrl.config`, which exports its class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass
class EngineConfig:
    """The inference engine: where generation runs, and the in-process engine's knobs."""

    kind: Literal["local", "remote"] = "local"
    """local: the in-process engine; remote: generate on the servers of engine.urls
    (`agentrl serve`, vLLM or SGLang), pushing new weights to them after every update."""
    urls: list[str] = field(default_factory=list)
    """Base URLs of the inference servers (engine.kind=remote), e.g. [http://127.0.0.1:8000];
    an episode's turns go to one server (sticky, for its prefix cache)."""
    protocol: Literal["agentrl", "vllm", "sglang"] = "agentrl"
    """Wire format of the servers: agentrl (`agentrl serve`: token ids, logprobs and per-id policy
    versions, weights over HTTP), vllm (/inference/v1/generate), sglang (/generate)."""
    api_key: Optional[str] = None
    """Bearer key the servers expect (their serve.api_key); null sends none."""
    api_key_file: Optional[str] = None
    """A file holding the key instead (its first line): the admin key file an `agentrl serve`
    without serve.api_key writes to its run folder (RUN_DIR/serve-PORT.key), which pushing
    weights to it needs. The key stays out of the run's saved config."""
    request_timeout: float = 600.0
    """Seconds one request to a server may take before it counts as failed."""
    max_retries: int = 3
    """Attempts after the first for a request whose server does not answer (connection error,
    timeout, 5xx), each on the next live server; then the request fails with an EngineError."""
    weights_dir: Optional[str] = None
    """A folder the servers can read (shared disk): weight pushes are written there and the
    servers load them from disk. Needed for vllm and sglang (the folder their server was started
    with); for agentrl, null streams the weights in the request body instead."""
    max_num_seqs: int = 256
    """Most sequences the engine decodes at once (vLLM's name); further requests queue."""
    max_num_batched_tokens: int = 8192
    """Most positions (padding included) of one prefill pass of the engine; a longer
    prompt is prefilled in chunks over several steps (vLLM's name)."""
    max_total_tokens: Optional[int] = None
    """KV-cache budget of the engine in tokens (SGLang's name): a running sequence counts
    its prompt + max_new_tokens, a parked prefix cache its length; requests beyond it queue.
    null = max_num_seqs * the context limit."""
    enable_prefix_caching: bool = True
    """Keep each episode's KV between turns and share prompt prefixes (a GRPO group's first
    prompt), so that only new ids are prefilled (vLLM's name)."""
    kv_on_weight_update: Literal["recompute", "keep"] = "recompute"
    """After a weight update, KV computed under older weights is recomputed (running sequences
    re-prefill, parked prefix caches are dropped) or kept and reported in Completion.kv_version."""
    enforce_eager: bool = False
    """vLLM's name. On CUDA the engine replays its decode pass as CUDA graphs captured per padded
    batch size (a pass of a small model is bound by kernel launches); true runs every pass
    eagerly. On CPU every pass is eager either way."""
