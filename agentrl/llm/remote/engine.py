"""`RemoteEngine`: the `InferenceEngine` contract over HTTP, for generation on inference servers
(`agentrl serve`, vLLM, SGLang; wire formats in wire.py). The trainer cannot tell it
from the in-process engine.

- **Sticky routing.** An episode's turns go to the server that served its first turn (the
  episode is `engine.episode_key()`: the asyncio task, or what a session sets), so the server
  finds the episode's prefix in its cache; a new episode goes to the server with the fewest
  requests in flight.
- **Seeds travel.** A request without a seed gets one from the engine's own seed stream (as
  the local engine does), so the server never draws one and a run is reproducible.
- **Weights.** `load_weights` pushes the new weights to every server (in parallel) and returns
  the new version; every id carries the version that produced it (the agentrl server reports
  it per id; for vLLM/SGLang it is the version pushed when the request was sent).
- **Failures.** A connection error, timeout or 5xx is retried on the next live server, with
  backoff, up to `max_retries` times; a server that failed is skipped for a while; after the
  last try the request fails with one line naming the server. A 4xx is the request's fault:
  it fails at once with the server's message.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from agentrl.atomic import write_atomic
from agentrl.errors import EngineError
from agentrl.llm.engine import Completion, SamplingParams, episode_key
from agentrl.llm.remote.wire import WIRES, FolderWire, Wire
from agentrl.llm.weights import adapter_to_bytes, save_file_atomic, save_model_folder, to_bytes
from agentrl.models.lora import ADAPTER_CONFIG, is_adapter_state

DOWN_SECONDS = 5.0  # a server that failed is tried again only after this long (unless all are down)
MAX_ROUTES = 65536  # episodes remembered for sticky routing (least recently used forgotten)


class RemoteEngine:
    """Generation on inference servers at `urls`, in wire format `protocol`."""

    def __init__(self, urls: list[str], protocol: str = "agentrl", *, api_key: str | None = None,
                 timeout: float = 600.0, max_retries: int = 3, weights_dir: str | None = None,
                 model_config: Any = None, seed: int = 0, retry_delay: float = 0.5) -> None:
        if not urls:
            raise EngineError("RemoteEngine needs at least one server URL")
        if protocol not in WIRES:
            raise EngineError(f"unknown engine protocol {protocol!r}; known: {', '.join(WIRES)}")
        self.urls = [u.rstrip("/") for u in urls]
        self.wire: Wire = WIRES[protocol]()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_delay = retry_delay
        self.weights_dir = Path(weights_dir) if weights_dir else None
        self.model_config = model_config  # written next to pushed weights for servers that reload folders
        self.policy_version = 0
        self._seed_rng = random.Random(seed)
        self._routes: OrderedDict[int, int] = OrderedDict()
        self._inflight = [0] * len(self.urls)
        self._down_until = [0.0] * len(self.urls)
        self._turn = 0
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}
        self._lock = threading.Lock()
        self._sync = httpx.Client(timeout=timeout, headers=self.headers, transport=nodelay_transport())
        self._stats = {"requests": 0, "retries": 0, "generated": 0, "seconds": 0.0, "pushes": 0, "push_seconds": 0.0}
        self._closed = False

    # ------------------------------------------------------------------ generation
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Continue `prompt_ids` on the episode's server; the new ids exactly as the server produced them."""
        if self._closed:
            raise EngineError("the engine is closed")
        if sampling.seed is None:
            sampling = replace(sampling, seed=self.next_seed())
        key = id(episode_key())
        version = self.policy_version
        body = self.wire.generate_body(list(prompt_ids), sampling)
        client = self._client()
        server, error = self._route(key), ""
        t0 = time.perf_counter()
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._stats["retries"] += 1
                await asyncio.sleep(self.retry_delay * 2 ** (attempt - 1))
                server = self._route(key, avoid=server)
            url = self.urls[server]
            self._inflight[server] += 1
            try:
                resp = await client.post(url + self.wire.generate_path, json=body)
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                self._mark_down(server)
                continue
            finally:
                self._inflight[server] -= 1
            if resp.status_code >= 500 or resp.status_code == 429:
                error = f"HTTP {resp.status_code}: {error_message(resp)}"
                self._mark_down(server)
                continue
            if resp.status_code >= 400:
                raise EngineError(f"engine server {url} refused the request (HTTP {resp.status_code}): "
                                  f"{error_message(resp)}")
            completion = self._parse(resp, url, version)
            self._stats["requests"] += 1
            self._stats["generated"] += len(completion.token_ids)
            self._stats["seconds"] += time.perf_counter() - t0
            return completion
        raise EngineError(f"engine server {self.urls[server]} is not answering ({error}) after "
                          f"{self.max_retries + 1} tries; is the server running (`agentrl serve`)?")

    def next_seed(self) -> int:
        """The next seed of the engine's own stream (what a request without one is sent with)."""
        return self._seed_rng.getrandbits(63)

    def _parse(self, resp: httpx.Response, url: str, version: int) -> Completion:
        try:
            return self.wire.completion(resp.json(), version)
        except EngineError:
            raise
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise EngineError(f"engine server {url} answered in an unexpected format for protocol "
                              f"{self.wire.name!r} ({type(e).__name__}: {e}); check engine.protocol") from None

    def _client(self) -> httpx.AsyncClient:
        """The HTTP client of the running event loop (a client's connections belong to one loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for k, (other, _) in list(self._clients.items()):
                if other.is_closed():
                    del self._clients[k]  # its loop ended; its connections went with it
            entry = self._clients.get(id(loop))
            if entry is None or entry[0] is not loop:
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
                entry = self._clients[id(loop)] = (loop, httpx.AsyncClient(timeout=self.timeout, headers=self.headers,
                                                                           limits=limits))
            return entry[1]

    def _route(self, key: int, avoid: int | None = None) -> int:
        """The episode's server: the one it used, else the live server with the fewest requests in flight."""
        now = time.monotonic()
        with self._lock:
            known = self._routes.get(key)
            if known is not None and known != avoid and self._down_until[known] <= now:
                self._routes.move_to_end(key)
                return known
            live = [i for i in range(len(self.urls)) if self._down_until[i] <= now and i != avoid]
            live = live or [i for i in range(len(self.urls)) if i != avoid] or [0]
            self._turn += 1
            pick = min(live, key=lambda i: (self._inflight[i], (i - self._turn) % len(self.urls)))
            self._routes[key] = pick
            self._routes.move_to_end(key)
            while len(self._routes) > MAX_ROUTES:
                self._routes.popitem(last=False)
            return pick

    def set_url(self, server: int, url: str) -> None:
        """Point server `server` at `url` (a restarted server on a new address), counted live again."""
        with self._lock:
            self.urls[server] = url.rstrip("/")
            self._down_until[server] = 0.0

    def _mark_down(self, server: int) -> None:
        with self._lock:
            self._down_until[server] = time.monotonic() + DOWN_SECONDS

    # ------------------------------------------------------------------ control
    def load_weights(self, state_dict: dict[str, Any], version: int | None = None) -> int:
        """Push new weights to every server (each applies them between two of its steps); return
        the new policy version (`version`, or the current one plus one)."""
        version = self.policy_version + 1 if version is None else version
        t0 = time.perf_counter()
        if self.wire.name == "agentrl":
            adapter = is_adapter_state(state_dict)  # LoRA: the adapter travels, never the base
            route = "/agentrl/adapter" if adapter else "/agentrl/weights"
            data = adapter_to_bytes(state_dict, ADAPTER_CONFIG) if adapter else None
            if self.weights_dir is not None:  # a shared disk: write once, every server reads it
                stem = "adapter" if adapter else "policy"
                path = self.weights_dir / f"{stem}-v{version}.safetensors"
                if data is None:
                    save_file_atomic(state_dict, path)
                else:
                    write_atomic(path, data)
                self._each("post", route, json={"path": str(path.resolve()), "version": version})
                for old in self.weights_dir.glob(f"{stem}-v*.safetensors"):
                    if old != path:
                        old.unlink(missing_ok=True)
            else:
                self._each("post", f"{route}?version={version}", content=to_bytes(state_dict) if data is None else data,
                           headers={"content-type": "application/octet-stream"})
        else:
            assert self.weights_dir is not None, "vllm/sglang load weights from engine.weights_dir"
            assert isinstance(self.wire, FolderWire), "only agentrl servers take weights other than as a folder"
            save_model_folder(state_dict, self.weights_dir, self.model_config)
            for route, body in self.wire.reload(str(self.weights_dir.resolve())):
                self._each("post", route, json=body)
        self.policy_version = version
        self._stats["pushes"] += 1
        self._stats["push_seconds"] += time.perf_counter() - t0
        return version

    def reset_prefix_cache(self) -> bool:
        """Drop every server's cached prefixes; False if any server refused (requests running)."""
        answers = self._each("post", self.wire.reset_path, json={}, check=False)
        return all(self.wire.reset_ok(status, data) for status, data in answers)

    def pop_metrics(self) -> dict[str, float]:
        """perf/engine_* of the servers (agentrl: summed; rates averaged) and perf/remote_* of this client."""
        out: dict[str, float] = {}
        if self.wire.name == "agentrl":  # best effort: a server that does not answer is counted, not fatal
            answers = self._each("post", "/agentrl/metrics", json={}, tolerate=True)
            rows = [data.get("metrics", {}) for status, data in answers if status == 200 and isinstance(data, dict)]
            out["perf/remote_servers_down"] = float(sum(status == 0 for status, _ in answers))
            for key in sorted({k for r in rows for k in r}):
                values = [float(r.get(key, 0.0)) for r in rows]
                average = key.endswith(("_per_s", "_rate", "_batch"))
                out[key] = sum(values) / len(values) if average else sum(values)
        s = self._stats
        out.update({"perf/remote_requests": float(s["requests"]), "perf/remote_retries": float(s["retries"]),
                    "perf/remote_request_seconds": s["seconds"] / s["requests"] if s["requests"] else 0.0,
                    "perf/remote_weight_push_seconds": s["push_seconds"]})
        self._stats = dict.fromkeys(s, 0) | {"seconds": 0.0, "push_seconds": 0.0}
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue: policy version and the seed stream."""
        return {"policy_version": self.policy_version, "seed_rng": self._seed_rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (and tell agentrl servers the version)."""
        self.policy_version = int(state["policy_version"])
        self._seed_rng.setstate(state["seed_rng"])
        if self.wire.name == "agentrl":
            self._each("post", "/agentrl/state", json={"policy_version": self.policy_version})

    def reseed(self, seed: int) -> None:
        """Reset the stream that gives seeds to requests that bring none."""
        self._seed_rng = random.Random(seed)

    def close(self) -> None:
        """Refuse further requests and close the connections (the servers keep running)."""
        self._closed = True
        self._sync.close()
        with self._lock:
            self._clients.clear()

    # ------------------------------------------------------------------ every server at once
    def _each(self, method: str, path: str, check: bool = True, tolerate: bool = False,
              **kwargs: Any) -> list[tuple[int, Any]]:
        """(status, JSON) of `path` on every server, in parallel, each retried like a generation
        (`tolerate`: one try, and a server that does not answer gives (0, None))."""
        def one(url: str) -> tuple[int, Any]:
            error = ""
            for attempt in range(1 if tolerate else self.max_retries + 1):
                if attempt:
                    time.sleep(self.retry_delay * 2 ** (attempt - 1))
                try:
                    resp = self._sync.request(method, url + path, **kwargs)
                except httpx.HTTPError as e:
                    error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                    continue
                if resp.status_code >= 500:
                    error = f"HTTP {resp.status_code}: {error_message(resp)}"
                    continue
                if check and resp.status_code >= 400:
                    raise EngineError(f"engine server {url} refused {path.split('?')[0]} (HTTP {resp.status_code}): "
                                      f"{error_message(resp)}")
                try:
                    return resp.status_code, resp.json()
                except ValueError:
                    return resp.status_code, None
            if tolerate:
                return 0, None
            raise EngineError(f"engine server {url} is not answering {path.split('?')[0]} ({error}) after "
                              f"{self.max_retries + 1} tries; is the server running (`agentrl serve`)?")
        if len(self.urls) == 1:
            return [one(self.urls[0])]
        with ThreadPoolExecutor(len(self.urls)) as pool:
            return list(pool.map(one, self.urls))


def nodelay_transport() -> httpx.HTTPTransport:
    """A blocking HTTP transport with TCP_NODELAY: without it a request whose headers and body go
    out in two writes waits for the server's delayed ACK (40 ms on Linux loopback)."""
    return httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])


def error_message(resp: httpx.Response) -> str:
    """The one-line message of an error response (OpenAI-style body, else its text)."""
    try:
        data = resp.json()
    except ValueError:
        return (resp.text.strip().splitlines() or [""])[0][:300]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message", data)))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:300]
    return str(data)[:300]


KEY_HINT = ("set engine.api_key to the server's serve.api_key, or engine.api_key_file to the admin key file an "
            "`agentrl serve` without one printed at start (RUN_DIR/serve-PORT.key)")


def check_server(url: str, protocol: str, api_key: str | None = None, timeout: float = 5.0) -> str | None:
    """Why the server at `url` cannot serve (one line), or None when it answers its health route
    (and, an agentrl server, takes the key on its control routes: an empty prefix-cache reset)."""
    wire = WIRES[protocol]()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = url.rstrip("/")
    try:
        resp = httpx.get(base + wire.health, headers=headers, timeout=timeout)
        info = httpx.get(base + "/agentrl/info", headers=headers, timeout=timeout) \
            if protocol == "agentrl" and resp.status_code < 400 else None
        admin = httpx.post(base + wire.reset_path, json={}, headers=headers, timeout=timeout) \
            if info is not None and info.status_code == 200 else None
    except httpx.HTTPError as e:
        return f"does not answer ({type(e).__name__}: {e})" if str(e) else f"does not answer ({type(e).__name__})"
    if resp.status_code == 401:
        return f"refused the API key ({KEY_HINT})"
    if resp.status_code >= 400:
        return f"answered {wire.health} with HTTP {resp.status_code}: {error_message(resp)}"
    if info is not None:
        if info.status_code == 401:
            return f"refused the API key ({KEY_HINT})"
        if info.status_code != 200:
            return f"is not an `agentrl serve` server (/agentrl/info: HTTP {info.status_code}); check engine.protocol"
    if admin is not None and admin.status_code == 401:
        return f"refused the admin key that pushing weights needs ({KEY_HINT})"
    return None


def server_info(url: str, api_key: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """An agentrl server's /agentrl/info (model, policy version, vocabulary, tokenizer fingerprint)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(url.rstrip("/") + "/agentrl/info", headers=headers, timeout=timeout).json()
