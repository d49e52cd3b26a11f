"""Helpers shared by tests (importable as `helpers`: pytest puts tests/ on sys.path)."""

import contextlib
import faulthandler
import os


def segments(mask):
    """(start, end) of each run of 1s in a loss mask: the spans the policy generated."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            out.append((start, i))
            start = None
    return out


class ScriptedReplies:
    """An LLM client that answers with the next of a fixed list of texts (plus EOS): the model's
    replies of a test, written out."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.outputs, self.prompts = tokenizer, list(replies), [], []

    async def generate(self, prompt_ids, sampling):
        from agentrl.llm.engine import Completion

        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        self.outputs.append(ids)
        self.prompts.append(list(prompt_ids))
        return Completion(ids, [-0.5] * len(ids), "stop")


class RecordingEngine:
    """Wraps a real engine and keeps every (prompt ids, completion) it served."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    async def generate(self, prompt_ids, sampling):
        out = await self.engine.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), out))
        return out

    def served(self):
        """{(prompt ids, output ids): completion} of every request."""
        return {(tuple(p), tuple(o.token_ids)): o for p, o in self.calls}


def nodelay_client(**kw):
    """A blocking httpx client with TCP_NODELAY (no 40 ms delayed-ACK wait per request on loopback)."""
    import socket

    import httpx

    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.Client(transport=transport, **kw)


# Built-in env types that wrap an optional suite: env name -> the module its extra installs.
SUITE_MODULES = {"gem": "gem", "minigrid": "minigrid", "reasoning_gym": "reasoning_gym", "openenv": "openenv"}
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Built-in env types that cannot be made without arguments (a server, an environment to load): the
# ones the checks give them, the repository's own example server and test environment.
ENV_ARGS = {
    "openenv": {"app": os.path.join(_ROOT, "examples", "openenv_server.py") + ":app"},
    "verifiers": {"load": "vf_arith:load_environment",
                  "paths": [os.path.join(_ROOT, "tests", "envs", "verifiers_envs")]},
}


def builtin_env(name):
    """A factory of the built-in env `name`, given the arguments it cannot do without (ENV_ARGS)."""
    from agentrl.registry import ENVS

    cls, args = ENVS.get(name), ENV_ARGS.get(name, {})
    return lambda: cls(**args)


def env_param(name):
    """`name` as a pytest param, skipped with the reason when its suite (or environment) is not installed."""
    import importlib.util

    import pytest

    module = SUITE_MODULES.get(name)
    missing = module is not None and importlib.util.find_spec(module) is None
    reason = f"{module} is not installed"
    if name == "verifiers":
        from agentrl.envs.verifiers import VENV, verifiers_python

        missing, reason = not os.path.isfile(verifiers_python()), VENV
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=reason))


@contextlib.contextmanager
def no_new_child_processes(stop, what: str):
    """Run the block, then `stop()`: no child process the block started may outlive it (processes
    that were already there, such as the W&B service of an earlier test, are not the block's)."""
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    stop()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, f"{what} outlived shutdown: {left}"


def watch_rank(seconds: int = 300) -> None:
    """In a process a test spawned: after `seconds` (10 is usual), print every thread's stack and
    exit 1, so a stuck collective fails its test saying where instead of holding the suite."""
    faulthandler.dump_traceback_later(seconds, exit=True)


def leave_rank() -> None:
    """End a spawned gloo rank whose results are on disk, without interpreter finalization.

    CI once hung here for good: gloo's worker threads can drop the last reference to a tensor
    owned by a Python object, which needs the GIL, and a finalizing interpreter never hands it to
    a non-main thread while the main thread joins them (pytorch/pytorch#190489). Every collective
    has completed on this rank and its peers hold their data, so nothing is left to tear down."""
    os._exit(0)


def without_plan(stderr):
    """A run's stderr without the run plan it logs at its start (a line `run plan of ...` and the
    indented lines under it): what the run said besides."""
    out, in_plan = [], False
    for line in stderr.splitlines():
        in_plan = line.startswith("run plan of ") or (in_plan and line.startswith("  "))
        if not in_plan:
            out.append(line)
    return "\n".join(out)


def bwrap_problem():
    """Why the python tool's bubblewrap sandbox cannot run here (its one-line refusal), or None."""
    from agentrl.errors import ConfigError
    from agentrl.registry import TOOLS
    from agentrl.tools import python  # noqa: F401 (registers it)

    try:
        TOOLS.get("python").start()
    except ConfigError as e:
        return str(e)
    return None


@contextlib.contextmanager
def agentrl_serve(*args, cwd):
    """`agentrl serve ARGS serve.port=0 serve.api_key=secret` in a subprocess; yields its URL (read
    from its first line) and stops it with SIGTERM, asserting a clean exit."""
    import signal
    import subprocess
    import sys

    import pytest

    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve", *args, "serve.port=0",
                             "serve.api_key=secret"], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()
    if not line.startswith("agentrl serve: "):
        proc.kill()
        pytest.fail(f"agentrl serve did not start: {line}{proc.stderr.read()[-2000:]}")
    yield line.split()[2]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # a clean stop on SIGTERM
