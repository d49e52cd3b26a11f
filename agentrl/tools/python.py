"""The built-in `python` tool: the model's code run in a sandbox (sandbox.py), its output returned.

Its settings (`agent.args.tool_args.python.<name>`) are the sandbox and its limits. The default
sandbox is bubblewrap; where bubblewrap cannot run, the tool refuses to start and says why, and
`sandbox: process` (weaker: see sandbox.py and docs/tools.md) runs the code as a plain process.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from typing import Any

from agentrl.errors import ConfigError, ToolError, ToolTimeout
from agentrl.tools.cgroup import home as cgroup_home
from agentrl.tools.cgroup import memory_bound_mb
from agentrl.tools.sandbox import SANDBOXES, Limits, Outcome, run_python, seccomp_filter
from agentrl.tools.tool import tool

_WORKS: set[str] = set()  # sandboxes seen to run code in this process
_WORKS_LOCK = threading.Lock()


def check_python(settings: dict[str, Any]) -> None:
    """Refuse to start, in one line, when the settings are out of range or the sandbox cannot run here."""
    where = "tool_args.python"
    sandbox = settings["sandbox"]
    if sandbox not in SANDBOXES:
        raise ConfigError(f"{where}.sandbox={sandbox!r}: expected one of {', '.join(SANDBOXES)} (bwrap: bubblewrap; "
                          "process: a plain process, weaker, see docs/tools.md)")
    for key in ("timeout", "cpu_seconds", "memory_mb", "max_processes", "max_output", "disk_mb"):
        if not settings[key] > 0:
            raise ConfigError(f"{where}.{key}={settings[key]!r}: expected a number > 0")
    if settings["memory_mb"] < 32:
        raise ConfigError(f"{where}.memory_mb={settings['memory_mb']}: the interpreter alone needs about 32 MB; "
                          "expected >= 32")
    cgroup_home()  # where a bound is weaker here (no cgroup, no seccomp filter), one warning line says so
    if sandbox == "bwrap":
        seccomp_filter()
    with _WORKS_LOCK:
        if sandbox in _WORKS:
            return
        weaker = f"or set {where}.sandbox=process to run the code as a plain process (weaker: docs/tools.md)"
        if sandbox == "bwrap" and shutil.which("bwrap") is None:
            raise ConfigError("the python tool's sandbox needs bubblewrap (the `bwrap` command), which is not "
                              f"installed: install it (Debian/Ubuntu: apt-get install bubblewrap), {weaker}")
        outcome = _run_now("print(6 * 7)", Limits(timeout=60.0, memory_mb=max(settings["memory_mb"], 64)), sandbox)
        if outcome.status != "ok" or outcome.output.strip() != "42":
            first = (outcome.output.strip().splitlines() or [f"{outcome.status}, exit code {outcome.exit_code}"])[0]
            raise ConfigError(f"the python tool's {sandbox} sandbox cannot run code here ({first}); {weaker}")
        _WORKS.add(sandbox)


def _run_now(code: str, limits: Limits, sandbox: str) -> Outcome:
    """`run_python` from synchronous code, whether or not this thread runs an event loop."""
    result: list[Outcome] = []
    worker = threading.Thread(target=lambda: result.append(asyncio.run(run_python(code, limits, sandbox))))
    worker.start()
    worker.join()
    if not result:
        return Outcome("the sandbox failed to start (see the log)", "error", None)
    return result[0]


@tool(check=check_python)
async def python(code: str, *, sandbox: str = "bwrap", timeout: float = 10.0, cpu_seconds: int = 5,
                 memory_mb: int = 256, max_processes: int = 8, max_output: int = 16384, disk_mb: int = 16) -> str:
    """Run a Python program and return what it prints (stdout and stderr). The standard library is available.

    Args:
        code: The Python program to run; print the values you want to see.
        sandbox: Where the code runs: bwrap (bubblewrap) or process (a plain process, weaker).
        timeout: Wall-clock seconds before the run is killed.
        cpu_seconds: CPU seconds each process may use.
        memory_mb: Address space of each process, in MB.
        max_processes: Processes (and threads) the code may have at once.
        max_output: Bytes of output kept; printing more kills the run.
        disk_mb: Size of the private /tmp in MB (bwrap), and the largest file the code may write.
    """
    limits = Limits(timeout=timeout, cpu_seconds=cpu_seconds, memory_mb=memory_mb, max_processes=max_processes,
                    max_output=max_output, disk_mb=disk_mb)
    outcome = await run_python(code, limits, sandbox)
    if outcome.status == "ok":
        return outcome.output
    said = outcome.output.rstrip()
    if outcome.status == "timeout":
        raise ToolTimeout(_joined(said, f"the program ran past the {timeout:g} s time limit and was stopped"))
    bound = memory_bound_mb(max_processes, memory_mb, disk_mb)
    reason = {"cpu": f"the program used more than {cpu_seconds} s of CPU time and was stopped",
              "output": f"the program printed more than {max_output} bytes and was stopped",
              "memory": f"the program held more than the sandbox's {bound} MB of memory and was killed",
              "signal": f"the program was killed by signal {-(outcome.exit_code or 0)}",
              "error": f"exit code {outcome.exit_code}"}[outcome.status]
    raise ToolError(_joined(said, reason))


def _joined(output: str, reason: str) -> str:
    return f"{output}\n({reason})" if output else f"({reason})"
