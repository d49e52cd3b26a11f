"""Config of serving: where the engine runs (`engine.kind`, `engine.urls`, `engine.protocol`)
and how `agentrl serve` answers (`serve:`), with their model-free checks.

`EngineServing` holds the engine section's placement fields (the `engine:` section in
config.py adds the local engine's knobs to it); `ServeConfig` is the `serve:` section.
`validate_serve` runs with the rest of the config's validation: one line per bad value,
before anything is built. Whether a remote URL answers is checked in runtime/preflight.py,
still before any model is built.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Optional
from urllib.parse import urlsplit

from agentrl.errors import ConfigError, shown

if TYPE_CHECKING:  # config.py calls validate_serve; the type only is needed here
    from agentrl.config.schema import Config


@dataclass
class EngineServing:
    """Where generation runs: in this process, or on inference servers over HTTP."""

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


@dataclass
class ServeConfig:
    """`agentrl serve`: the HTTP server of the policy (OpenAI routes, vLLM's token route, sessions)."""

    host: str = "127.0.0.1"
    """Interface to bind. Loopback (127.x, ::1, localhost) unless serve.api_key is set: decided by
    the address bound, offline, so a name only a resolver knows (127.0.0.1.nip.io) needs the key."""
    port: int = 8000
    """TCP port; 0 picks a free one (printed at start)."""
    api_key: Optional[str] = None
    """Requests must send `Authorization: Bearer <api_key>` on every route but /health (401
    otherwise). Null: the generation routes are open to this machine, and the control routes
    (weights, state, cache, metrics) take the admin key made at start-up instead."""
    served_model_name: Optional[str] = None
    """The model id in /v1/models (vLLM's name); null: the folder name of model.path, or agentrl."""
    max_tokens: int = 2048
    """Largest max_tokens a request may ask (a larger one is a 400); the default when it asks none."""
    max_n: int = 16
    """Most choices (n) per request."""
    max_request_bytes: int = 2_000_000
    """Largest request body (weights excepted); a larger one is answered 413, counted as it streams in."""
    max_weights_bytes: int = 64_000_000_000
    """Largest weights body; the served model's own size (its tensors in their dtype or float32,
    plus the header) caps it further, counted as it streams in."""
    max_inflight: int = 4096
    """Most generation requests in progress at once; beyond it requests are answered 429."""
    weights_dir: Optional[str] = None
    """A folder the weight-update route may load safetensors files from (JSON `{path, version}`:
    a run's engine.weights_dir on a disk both share); null: weights come in the request body only.
    A path outside the folder (a link leading out included) is answered as a missing file is."""
    idle_timeout: float = 30.0
    """Seconds a connection may keep the server waiting (for a request's head, the rest of its body,
    or the next request) before the server closes it."""


def validate_serve(cfg: Config) -> None:
    """The engine placement and serve sections: one line per bad value."""
    e, s = cfg.engine, cfg.serve
    if e.kind == "remote" and not e.urls:
        raise ConfigError("engine.kind=remote needs engine.urls, e.g. engine.urls=[http://127.0.0.1:8000] "
                          "(start one with `agentrl serve CONFIG`)")
    for i, url in enumerate(e.urls):
        check_url(url, f"engine.urls[{i}]")
    if e.api_key is not None and e.api_key_file is not None:
        raise ConfigError("engine.api_key and engine.api_key_file are both set; give the key one way")
    if len(set(e.urls)) != len(e.urls):
        raise ConfigError(f"engine.urls={e.urls} names a server twice; list each once")
    if e.kind == "remote" and e.protocol in ("vllm", "sglang") and not e.weights_dir:
        raise ConfigError(f"engine.protocol={e.protocol} loads new weights from disk: set engine.weights_dir to "
                          f"the folder the {e.protocol} servers were started with (a disk they share with training)")
    if not s.host.strip():
        raise ConfigError("serve.host must name an interface, e.g. 127.0.0.1")
    for name, key in (("engine.api_key", e.api_key), ("serve.api_key", s.api_key)):
        if key is not None:
            check_api_key(key, name)
    if not is_loopback(s.host) and s.api_key is None:
        raise ConfigError(f"serve.host={shown(s.host)} is not a loopback address (127.x, ::1 or localhost; a name "
                          "is not resolved): it would expose the server beyond this machine: set serve.api_key too "
                          "(or keep serve.host=127.0.0.1)")


def check_api_key(key: str, name: str) -> None:
    """A bearer key an HTTP header can carry: printable ASCII, no spaces (the key is never echoed)."""
    if not key.strip():
        raise ConfigError(f"{name} is empty; give a key or null for none")
    bad = next((c for c in key if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ConfigError(f"{name} holds {bad!r} (character {key.index(bad) + 1}): a key travels in an HTTP "
                          "header, so it may hold only printable ASCII characters without spaces")


def check_url(url: str, name: str) -> None:
    """An http(s) URL with a host (and nothing after the base path but a trailing slash)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ConfigError(f"{name}={shown(url)} is not a URL ({err}); give e.g. http://127.0.0.1:8000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name}={shown(url)} must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ConfigError(f"{name}={shown(url)}: give the server's base URL, without ?query or #fragment")
    if port == 0:
        raise ConfigError(f"{name}={shown(url)}: port 0 is not a server's port")


def host_address(host: str) -> str:
    """What binding `host` binds: an IP literal as given, localhost as 127.0.0.1 (RFC 6761: never
    sent to a resolver), any other name as the system resolves it then."""
    name = host.strip()
    return "127.0.0.1" if name.lower().rstrip(".") == "localhost" else name


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine, decided without the network: only
    an address (or localhost) is known offline; a name a resolver must answer counts as outside."""
    try:
        ip = ipaddress.ip_address(host_address(host))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback, though Python < 3.13 says not
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
