"""The serve section of the experiment schema (`serve.*`): how `agentrl serve` answers, and what
binding its host means (decided offline, by address). Part of `agentrl.config`, which exports
its class; its checks are in checks.py (`validate_serve`)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from agentrl.errors import ConfigError, shown


@dataclass
class ServeConfig:
    """`agentrl serve`: the HTTP server of the policy (OpenAI routes, vLLM's token route, sessions)."""

    host: str = "127.0.0.1"
    """Interface to bind. Loopback (127.x, ::1, localhost) unless serve.api_key is set: decided by
    the address bound, offline, so a name only a resolver knows (127.0.0.1.nip.io) needs the key."""
    port: int = 8000
    """TCP port; 0 picks a free one (printed at start)."""
    api_key: str | None = None
    """Requests must send `Authorization: Bearer <api_key>` on every route but /health (401
    otherwise). Null: the generation routes are open to this machine, and the control routes
    (weights, state, cache, metrics) take the admin key made at start-up instead."""
    served_model_name: str | None = None
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
    weights_dir: str | None = None
    """A folder the weight-update route may load safetensors files from (JSON `{path, version}`:
    a run's engine.weights_dir on a disk both share); null: weights come in the request body only.
    A path outside the folder (a link leading out included) is answered as a missing file is."""
    idle_timeout: float = 30.0
    """Seconds a connection may keep the server waiting (for a request's head, the rest of its body,
    or the next request) before the server closes it."""
    allowed_hosts: list[str] = field(default_factory=list)
    """Host names the server answers to besides the loopback names (localhost, 127.0.0.1, ::1)
    and serve.host (the address it bound; any IP address when that is 0.0.0.0 or ::), with any
    port, e.g. [gpu-node-3.internal]. A request whose `Host` header (or a web page's `Origin`)
    names another host is refused (400, 403): a page whose name an attacker points at this
    machine (DNS rebinding) cannot read the server's answers. "*": any host (a proxy in front
    checks them)."""


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


_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})")


def check_allowed_hosts(hosts: object) -> None:
    """serve.allowed_hosts: a list of host names or IP addresses without scheme or port, or "*";
    one line naming the first that is not."""
    if not isinstance(hosts, list):
        raise ConfigError(f"serve.allowed_hosts={shown(hosts)} must be a list of host names, e.g. [gpu-node-3]")
    for i, host in enumerate(hosts):
        ok = isinstance(host, str) and (host == "*" or _HOST_NAME.fullmatch(host) is not None)
        if isinstance(host, str) and not ok:
            try:
                ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
                ok = True
            except ValueError:
                pass
        if not ok:
            raise ConfigError(f"serve.allowed_hosts[{i}]={shown(host)} is not a host name: give a name or IP address "
                              "without scheme or port (any port is accepted), e.g. gpu-node-3.internal, or \"*\" for "
                              "any host")
