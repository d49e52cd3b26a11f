"""The serve section of the experiment schema (`serve.*`): how `agentrl serve` answers, and what
binding its host means (decided offline, by address). Part of `agentrl.config`, which exports
its class; its checks are in checks.py (`validate_serve`)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional


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
