"""The Ray cluster a run uses: started here, or joined at runtime.address once a Ray cluster
is known to answer there.

`ray.init(address=...)` waits without end for a GCS that is not there (nothing listening, a
firewalled host, another service on the port), retrying in C++ where no signal or timeout of
ours reaches it. So the address is first tried here, within CONNECT_SECONDS: a TCP connection,
then the HTTP/2 connection preface, which every gRPC server (a head's GCS, the Ray client
server) answers with a SETTINGS frame. Anything else ends in one line naming the address.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from agentrl.config.runtime import ADDRESS_FORM
from agentrl.errors import ConfigError
from agentrl.hub import offline_env
from agentrl.runtime.ray.engine_client import first_line

CONNECT_SECONDS = 10.0
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # then an empty SETTINGS frame
_SETTINGS = 4  # HTTP/2 frame type, byte 3 of a frame header


def require_ray() -> Any:
    """The ray module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("runtime.kind=ray needs Ray: install the extra ray (pip install 'agentrl[ray]')") from None
    return ray


def worker_env() -> dict[str, Any]:
    """The job's runtime env: the driver's own import paths (a script's folder, tests/), so actors
    unpickle the classes it registered, and its Hub offline mode (agentrl/hub.py)."""
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = [p for p in sys.path if p and os.path.isdir(p) and not any(
        os.path.realpath(p).startswith(r) for r in roots)]
    # An engine reads its weights with a blocking get on purpose: it must not step meanwhile.
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
                         "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0", **offline_env()}}


def init_cluster(num_cpus: int | None = None, num_gpus: int | None = None, temp_dir: str | None = None,
                 address: str | None = None) -> None:
    """ray.init the way agentrl runs it: no dashboard, no token file in the home folder, session
    files in `temp_dir`, the driver's import paths for every worker."""
    ray = require_ray()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # else Ray writes ~/.ray/auth_token and warns
    kwargs: dict[str, Any] = {"logging_level": "ERROR", "runtime_env": worker_env()}
    if address:  # the cluster's own settings (dashboard, folders) are its owner's
        join_cluster(address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus, _temp_dir=temp_dir, include_dashboard=False,
                 **kwargs)


def join_cluster(address: str, **kwargs: Any) -> None:
    """ray.init(address=address, **kwargs), after check_reachable; Ray's refusals in one line."""
    import ray

    check_reachable(address)
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise ConfigError(f"runtime.address={address}: cannot join a Ray cluster there: {first_line(e)}") from None


def check_reachable(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """A gRPC server answers at `address` (auto: the cluster Ray would pick) within `timeout`."""
    target = _host_port(address)
    if target is None:  # auto found no cluster: ray.init says so at once
        return
    host, port = target
    where = f"runtime.address={address}" + (f" ({host}:{port})" if address == "auto" else "")
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if os.environ.get("RAY_USE_TLS", "0") not in ("0", ""):
                return  # a TLS server answers only after a handshake: the connection is what can be checked
            sock.settimeout(timeout)
            sock.sendall(_PREFACE)
            head = _read(sock, 9)
    except TimeoutError:
        raise ConfigError(f"{where}: no answer within {timeout:g} s; check the address and that the cluster is up "
                          "(`ray status` on its head)") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot connect ({e.strerror or e}); check the address and that the cluster is "
                          "up (`ray status` on its head)") from None
    if len(head) < 9 or head[3] != _SETTINGS:
        raise ConfigError(f"{where}: something answers there, but not a Ray cluster (no gRPC server); give the "
                          "head's GCS address (HOST:6379 by default) or ray://HOST:10001")


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a checked runtime.address; auto is resolved as Ray resolves it."""
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            address = canonicalize_bootstrap_address("auto") or ""
        except Exception:  # noqa: BLE001 (Ray's own lookup failed: ray.init reports it, at once)
            return None
        if not address:
            return None
    m = ADDRESS_FORM.fullmatch(address)
    if m is None:  # checked with the config; anything else is Ray's own to resolve
        return None
    return m["host"].strip("[]"), int(m["port"] or 10001)  # 10001: the Ray client server's default port


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data
