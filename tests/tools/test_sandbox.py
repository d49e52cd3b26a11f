"""The `python` tool's sandbox against hostile code, as the model would write it: each attack is
contained, answered as a tool error, the run goes on, and no process of the sandbox is left.

These need bubblewrap (`make test` installs it, like chromium); where it cannot run they skip,
saying why, and the refusal itself is tested.
"""

import asyncio
import os
import shutil
import socket
import threading
from pathlib import Path

import psutil
import pytest

import agentrl.tools.python as python_tool
import agentrl.tools.sandbox as sandbox
from agentrl.errors import ConfigError
from agentrl.registry import TOOLS
from agentrl.tools import ToolError, ToolTimeout
from agentrl.tools.sandbox import _interpreter_folders
from helpers import bwrap_problem

SANDBOX_UIDS = range(1 << 30, 1 << 31)  # the user ids the sandbox takes when agentrl runs as root


PROBLEM = bwrap_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap cannot run here: {PROBLEM}")


def _sandbox_processes() -> set[int]:
    """Processes a sandbox may have left: descendants of this test process, and (as root) any
    process under a sandbox's user id that left every process tree (reparented to init). A
    sandbox process still under another process (another test session's live sandbox: suites
    may run side by side on one machine) is not this session's to judge."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    theirs = set()
    for p in psutil.process_iter(["uids"]):
        uids = p.info["uids"]
        if uids is not None and uids.real in SANDBOX_UIDS and _escaped(p):
            theirs.add(p.pid)
    return mine | theirs


def _escaped(p: psutil.Process) -> bool:
    """Whether every ancestor of `p` is init or a sandbox process itself (no live caller holds it)."""
    try:
        return all(q.pid == 1 or q.uids().real in SANDBOX_UIDS for q in p.parents())
    except psutil.Error:  # gone meanwhile
        return False


@pytest.fixture
def python():
    """Call the python tool as the tool agent does; no process of the call may outlive it."""
    before = _sandbox_processes()
    t = TOOLS.get("python").configure({"timeout": 20.0, "cpu_seconds": 2, "memory_mb": 256, "max_processes": 8,
                                       "max_output": 4096}, "tool_args.python")

    def call(code, **settings):
        return asyncio.run(t.configure(settings, "tool_args.python").run({"code": code}))

    yield call
    left = [psutil.Process(p) for p in _sandbox_processes() - before if psutil.pid_exists(p)]
    assert not left, f"a sandbox process outlived its call: {[(p, p.status(), p.uids(), p.cmdline()) for p in left]}"
    assert call("print(6 * 7)") == "42\n"  # and the tool still works


@needs_bwrap
def test_code_runs_and_prints(python):
    assert python("import sys\nprint(sum(range(10)))\nprint('to stderr', file=sys.stderr)") == "45\nto stderr\n"
    with pytest.raises(ToolError, match=r"(?s)ZeroDivisionError.*\(exit code 1\)"):
        python("1 / 0")


@needs_bwrap
def test_a_fork_bomb_is_contained(python):
    with pytest.raises(ToolError):  # forks that keep trying: stopped with their namespace
        python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", timeout=3.0)
    counting = ("import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError as e:\n"
                "        print('forked', n, e)\n        break\n    if pid == 0:\n        time.sleep(60)\n"
                "        os._exit(0)\n    n += 1\n")
    printed = python(counting)  # the process limit (8, threads and the sandbox's own first process included)
    assert printed.startswith("forked ") and int(printed.split()[1]) < 8 and "Resource temporarily unavailable" in printed


@needs_bwrap
def test_a_memory_bomb_is_contained(python):
    with pytest.raises(ToolError, match="MemoryError"):
        python("blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))\n")


@needs_bwrap
def test_an_infinite_loop_is_stopped(python):
    with pytest.raises(ToolError, match="used more than 2 s of CPU time"):  # the wall clock is far off
        python("while True:\n    pass\n", timeout=300.0)
    with pytest.raises(ToolTimeout, match="time limit"):  # asleep: no CPU time spent, the wall clock stops it
        python("import time\ntime.sleep(3600)\n", timeout=1.0)


@needs_bwrap
def test_endless_output_is_cut(python):
    with pytest.raises(ToolError, match="printed more than 4096 bytes") as e:
        python("while True:\n    print('spam' * 100)\n")
    assert len(str(e.value)) < 4096 + 200


@needs_bwrap
def test_the_network_is_unreachable(python):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []
    server.settimeout(0.5)

    def serve():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    listener = threading.Thread(target=serve)
    listener.start()
    try:
        with pytest.raises(ToolError, match="ConnectionRefusedError|Network is unreachable"):
            python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)\n")
        with pytest.raises(ToolError, match="Network is unreachable|Name or service|Temporary failure"):
            python("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=5)\n")
    finally:
        listener.join()
        server.close()
    assert accepted == []  # the host's loopback never saw it


@needs_bwrap
def test_writing_outside_its_folder_fails(python, tmp_path):
    target = tmp_path / "written_by_the_sandbox"
    with pytest.raises(ToolError, match="FileNotFoundError|Read-only|Permission"):
        python(f"open({str(target)!r}, 'w').write('x')\n")
    with pytest.raises(ToolError, match="Read-only|Permission"):
        python("open('/usr/written_by_the_sandbox', 'w').write('x')\n")
    assert not target.exists() and not os.path.exists("/usr/written_by_the_sandbox")
    assert python("open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())\n") == "ok\n"


@needs_bwrap
def test_the_hosts_files_cannot_be_read(python, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret")
    with pytest.raises(ToolError, match="FileNotFoundError") as e:
        python(f"print(open({str(secret)!r}).read())\n")
    assert "the host's secret" not in str(e.value)
    seen = set(python("import os\nprint(*os.listdir('/'))\n").split())
    interpreter = {Path(f).parts[1] for f in _interpreter_folders()}  # bound where it lives (e.g. under /root)
    assert seen <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "proc", "sbin", "tmp", "usr"} | interpreter
    assert python("import os\nprint(sorted(os.listdir('/tmp')))\n") == "['main.py']\n"


@needs_bwrap
def test_killing_its_parent_harms_nobody(python):
    me = os.getpid()
    with pytest.raises(ToolError):
        python(f"import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill({me}, signal.SIGKILL)\n")
    with pytest.raises(ToolError):
        python("import os, signal\nos.killpg(0, signal.SIGKILL)\nprint('survived')\n")
    assert psutil.pid_exists(me)


@needs_bwrap
def test_a_daemon_it_leaves_goes_with_it(python):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3600)\nprint('parent done')\n"
    assert python(code) == "parent done\n"  # the fixture checks that the daemon is gone


def test_where_bubblewrap_is_missing_the_tool_refuses_to_start_unless_asked_for_a_weaker_sandbox(
        monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on the PATH
    monkeypatch.setattr(python_tool, "_WORKS", set())
    with pytest.raises(ConfigError, match=r"needs bubblewrap .* not installed.*sandbox=process") as e:
        TOOLS.get("python").start()
    assert "\n" not in str(e.value)
    monkeypatch.setenv("PATH", os.environ["PATH"] if shutil.which("python3") else "/usr/bin:/bin")
    weaker = TOOLS.get("python").configure({"sandbox": "process", "timeout": 2.0}, "tool_args.python")
    weaker.start()
    assert asyncio.run(weaker.run({"code": "print(6 * 7)"})) == "42\n"
    with pytest.raises(ToolTimeout):
        asyncio.run(weaker.run({"code": "import time\ntime.sleep(3600)"}))
    with pytest.raises(ConfigError, match=r"sandbox='docker': expected one of bwrap, process"):
        TOOLS.get("python").configure({"sandbox": "docker"}, "tool_args.python").start()


@needs_bwrap
def test_a_sandbox_still_running_after_the_kill_wait_is_killed_and_reaped(monkeypatch):
    """Should bwrap outlive KILL_WAIT after the kill, it is killed itself and waited for: the run
    ends with its exit status (not None) and leaves no process."""
    before = _sandbox_processes()
    monkeypatch.setattr(sandbox, "KILL_WAIT", 0.0)  # no kill is ever waited for long enough
    out = asyncio.run(sandbox.run_python("import time\ntime.sleep(3600)\n", sandbox.Limits(timeout=1.0)))
    assert out.status == "timeout"
    assert out.exit_code is not None
    assert _sandbox_processes() <= before
