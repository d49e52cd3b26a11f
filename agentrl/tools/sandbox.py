"""A sandbox for untrusted Python code: bubblewrap around a separate process, with limits.

`run_python(code, limits, sandbox)` runs `code` as `main.py` in a fresh interpreter (the one
running agentrl, isolated with `-I`: the standard library and the interpreter's own
site-packages, not the run's virtualenv) and returns what it printed, stdout and stderr
interleaved, and how it ended.

`sandbox="bwrap"` (Debian's `bubblewrap`, what Flatpak uses): new pid, network, IPC, UTS and
cgroup namespaces (no network at all: only a loopback that is down; the host's processes are
invisible), the system (`/usr`) and the interpreter's folder bound read-only and nothing else of
the host's files, a private `/tmp` (a tmpfs of `disk_mb`, the only writable place, gone with the
run; as root, mounted by us in a mount namespace of its own so that it also bounds its file count,
`TMP_FILES`), a cleared environment, a new session (no terminal to inject keys into), a seccomp
filter (seccomp.py: no nested namespaces, mounts, ptrace, memfd or SysV IPC, ...), and killed with
the run's parent. Inside, before the code starts: CPU time, address space, file size, open files
and process count limits (`setrlimit`), and, when agentrl runs as root, a user id of its own (a
random unprivileged one: a process limit counts per user, and root is exempt from it). Where the
machine gives one (cgroup.py), each run of either sandbox is also in a cgroup of its own that
bounds all the memory it makes the kernel hold and its processes. When the code
times out, prints past `max_output` bytes, or the caller stops waiting, the sandbox's first
process is killed, which makes the kernel kill every process in its pid namespace; the call
returns only once the sandbox is gone.

`sandbox="process"` is weaker, for machines where bubblewrap cannot run, and only when asked
for by name: the same limits on a plain process in its own session and a temporary folder, but
the code sees the host's files and network, and a process that leaves its session outlives the
call (and without root there is no process-count limit: it would count every process of the user).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import platform
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agentrl.tools import seccomp
from agentrl.tools.cgroup import SandboxCgroup

log = logging.getLogger(__name__)
SANDBOXES = ("bwrap", "process")
KILL_WAIT = 30.0  # seconds to wait for a killed sandbox to be gone before giving up on it
# Open files per process: what a program needs, and few enough that what files and pipes can hold
# outside the address space limit stays small (inherited, it was the host's: 20,000 here).
MAX_OPEN_FILES = 64
# Files and folders in a run's /tmp (main.py included), where agentrl mounts it (as root): each
# costs about 1 KB of kernel memory that no address space limit counts (bubblewrap sets no count).
TMP_FILES = 4096

# Runs first in the sandbox: the limits, our own user id (as root), then the code, in a fresh
# interpreter, unbuffered (what it printed before it was stopped is kept, in the order written).
# RLIMIT_CPU's hard limit one second past the soft one: SIGXCPU, then SIGKILL.
_BOOT = """import os, resource, sys
cpu, mem, fsize, nproc, uid, nofile = (int(x) for x in sys.argv[1:7])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
if nproc:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
if uid:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
os.execv(sys.executable, [sys.executable, "-I", "-B", "-u", "main.py"])
"""


@dataclass(frozen=True)
class Limits:
    """What one run of code may use."""

    timeout: float = 10.0  # wall-clock seconds, then the sandbox is killed
    cpu_seconds: int = 5  # CPU time of each process
    memory_mb: int = 256  # address space of each process
    max_processes: int = 8  # processes (and threads) at once
    max_output: int = 16384  # bytes of stdout + stderr kept; more kills the run
    disk_mb: int = 16  # size of the private /tmp (bwrap), and of each file written


@dataclass(frozen=True)
class Outcome:
    """How a run ended: `status` is ok, error (a non-zero exit), timeout, cpu, memory (killed at its
    cgroup's memory limit), output or signal."""

    output: str  # stdout and stderr as written, at most max_output bytes
    status: str
    exit_code: int | None


async def run_python(code: str, limits: Limits, sandbox: str = "bwrap") -> Outcome:
    """Run `code` in the named sandbox within `limits`; return what it printed and how it ended."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"sandbox={sandbox!r}: expected one of {', '.join(SANDBOXES)}")
    # bwrap binds the interpreter where any user reaches it; a plain process needs it reachable on the host
    uid = _own_uid() if sandbox == "bwrap" or _others_can_run(os.path.realpath(sys.executable)) else 0
    folder = None if sandbox == "bwrap" else tempfile.mkdtemp(prefix="agentrl-sandbox-")
    cgroup = None
    try:
        cgroup = SandboxCgroup.create(limits.max_processes, limits.memory_mb, limits.disk_mb)
        procs = cgroup.procs_files() if cgroup is not None else []
        if folder is None:
            own_tmp = _can_mount_tmp()
            enter = _launcher(procs, _tmp_options(limits) if own_tmp else None)
            run = await _start_bwrap(code, limits, uid, enter, own_tmp)
        else:
            (Path(folder) / "main.py").write_text(code)
            if uid:
                os.chown(folder, uid, uid)
                os.chown(Path(folder) / "main.py", uid, uid)
            run = await _start_process(folder, limits, uid, _launcher(procs, None))
        outcome = await run.finish(limits)
        if outcome.status in ("cpu", "signal") and cgroup is not None and cgroup.oom_killed():
            return Outcome(outcome.output, "memory", None)  # SIGKILL from the cgroup's limit, not RLIMIT_CPU's
        return outcome
    finally:
        if cgroup is not None:
            await asyncio.to_thread(cgroup.remove)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _own_uid() -> int:
    """A fresh unprivileged user id when running as root (0: keep ours)."""
    return (1 << 30) + secrets.randbelow(1 << 30) if os.geteuid() == 0 else 0


def _others_can_run(path: str) -> bool:
    """Whether a user other than the owner can reach and run the file at `path`."""
    p = Path(path)
    folders_ok = all(os.stat(d).st_mode & stat.S_IXOTH for d in p.parents)
    return folders_ok and os.stat(p).st_mode & (stat.S_IROTH | stat.S_IXOTH) == stat.S_IROTH | stat.S_IXOTH


def _boot_args(limits: Limits, uid: int, nproc: bool) -> list[str]:
    return [os.path.realpath(sys.executable), "-I", "-B", "-c", _BOOT, str(limits.cpu_seconds),
            str(limits.memory_mb << 20), str(limits.disk_mb << 20), str(limits.max_processes if nproc else 0),
            str(uid), str(MAX_OPEN_FILES)]


def bwrap_command(limits: Limits, uid: int, code_fd: int, info_fd: int, seccomp_fd: int | None = None,
                  own_tmp: bool = False) -> list[str]:
    """The bubblewrap command line of one run (`code_fd` holds main.py, `info_fd` gets bwrap's info,
    `seccomp_fd` the compiled seccomp filter; `own_tmp`: /tmp is already the run's bounded tmpfs)."""
    cmd = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--clearenv", "--setenv", "HOME", "/tmp",
           "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
    if os.geteuid() != 0:
        cmd.append("--unshare-user")  # unprivileged: the namespaces come with a user namespace
        if _bwrap_can("--disable-userns"):  # and none nested in it (the seccomp filter refuses them too)
            cmd.append("--disable-userns")
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    cmd += ["--perms", "0755", "--dir", "/etc"]
    for name in ("/etc/ld.so.cache", "/etc/localtime"):
        cmd += ["--ro-bind-try", name, name]
    for folder in _interpreter_folders():
        for parent in reversed(Path(folder).parents[:-1]):  # made readable: the code runs as another user
            cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", folder, folder]
    if own_tmp:
        cmd += ["--bind", "/tmp", "/tmp"]
    else:  # bounded in size only: bubblewrap sets no inode count
        cmd += ["--size", str(limits.disk_mb << 20), "--perms", "1777", "--tmpfs", "/tmp"]
    cmd += ["--perms", "0644", "--file", str(code_fd), "/tmp/main.py", "--chdir", "/tmp",
            "--info-fd", str(info_fd)]
    return cmd + _boot_args(limits, uid, nproc=True)


# Moves itself into the sandbox's cgroups (the files before "--"), mounts the run's /tmp when given
# its options (in the mount namespace `unshare` made for it, which no other process sees), then runs bwrap.
_LAUNCH = """tmp=$1; shift
for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; shift
if [ -n "$tmp" ]; then mount -t tmpfs -o "$tmp" agentrl-tmp /tmp || exit 125; fi
exec "$@"
"""


def _launcher(procs: list[str], tmp_options: str | None) -> list[str]:
    """The command prefix that starts a sandbox: in its cgroups, and with its own /tmp when given options."""
    if not procs and tmp_options is None:
        return []
    unshare = ["unshare", "--mount", "--propagation", "private"] if tmp_options is not None else []
    return [*unshare, "/bin/sh", "-c", _LAUNCH, "sh", tmp_options or "", *procs, "--"]


def _tmp_options(limits: Limits) -> str:
    """The mount options of a run's /tmp: its size and how many files and folders it may hold."""
    return f"size={limits.disk_mb << 20},nr_inodes={TMP_FILES},mode=1777,nosuid,nodev"


@functools.cache
def _can_mount_tmp() -> bool:
    """Whether this process may mount each run's /tmp itself (as root, with util-linux's unshare and mount)."""
    if os.geteuid() != 0 or not all(shutil.which(c) for c in ("unshare", "mount")):
        return False
    try:  # a container may refuse new mount namespaces even to root
        probe = ["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "-o", _tmp_options(Limits()),
                 "agentrl-tmp", "/tmp"]
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def _bwrap_can(option: str) -> bool:
    """Whether the installed bubblewrap has `option` (`bwrap --help` lists it)."""
    try:
        return option in subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def seccomp_filter() -> bytes | None:
    """The compiled seccomp filter for this machine, or None (said once, in one warning line)."""
    if not seccomp.supported():
        log.warning("python sandbox: no seccomp filter for architecture %s (x86_64 and aarch64 only): the "
                    "sandbox's code may call mount, ptrace, unshare and the other calls it refuses "
                    "(see docs/tools.md)", platform.machine())
        return None
    return seccomp.filter_program()


def _interpreter_folders() -> list[str]:
    """The interpreter's installation, when it is not under /usr (pyenv, conda, uv, ...)."""
    folders = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))}
    kept = sorted(f for f in folders if not (f + "/").startswith("/usr/"))
    return [f for f in kept if not any(f.startswith(o + "/") for o in kept if o != f)]


class _Run:
    """A started sandbox: its process, the read end of its output, and how to kill all of it."""

    def __init__(self, proc: asyncio.subprocess.Process, output_fd: int, pidfd: int | None, bwrap: bool) -> None:
        self.proc, self.output_fd, self.pidfd, self.bwrap = proc, output_fd, pidfd, bwrap

    async def finish(self, limits: Limits) -> Outcome:
        """Read its output until it exits, its output or time runs out, or the caller stops waiting."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        # Our own pipe, closed when we are done, whoever still holds its other end.
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                    os.fdopen(self.output_fd, "rb", 0))
        out = bytearray()

        async def read() -> str | None:
            while chunk := await reader.read(65536):
                out.extend(chunk)
                if len(out) > limits.max_output:
                    return "output"
            return None

        reading = asyncio.ensure_future(read())
        waiting = asyncio.ensure_future(self.proc.wait())
        deadline = loop.time() + limits.timeout
        status = None
        try:
            done, _ = await asyncio.wait({reading, waiting}, timeout=limits.timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if done and not (reading.done() and reading.result()):
                if waiting.done() and not self.bwrap:
                    self._kill_group()  # the code's leftovers in its session (bwrap's died with its namespace)
                # the other one: the exit after the output closed, or the rest of the output after the exit
                await asyncio.wait({reading, waiting}, timeout=max(0.0, deadline - loop.time()))
            if reading.done() and reading.result():
                status = reading.result()
            elif not waiting.done():
                status = "timeout"
        finally:
            for task in (reading, waiting):
                task.cancel()
            transport.close()
            await self.kill()
        output = bytes(out[:limits.max_output]).decode("utf-8", errors="replace")
        code = self.proc.returncode
        assert code is not None  # kill() returns once the process has ended and been reaped
        if status is None:
            status, code = self._ended(code)
        return Outcome(output, status, code)

    def _ended(self, code: int) -> tuple[str, int | None]:
        # a signal: a negative code from a plain process, 128 + the signal from bwrap
        signo = -code if code < 0 else (code - 128 if self.bwrap and code > 128 else None)
        if signo in (signal.SIGXCPU, signal.SIGKILL):  # RLIMIT_CPU: SIGXCPU, then SIGKILL
            return "cpu", None
        if signo is not None:
            return "signal", -signo
        return ("ok" if code == 0 else "error"), code

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def kill(self) -> None:
        """Kill every process of the sandbox and wait until they are gone."""
        if self.pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)  # pid 1 of its namespace: all go
        else:
            self._kill_group()
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), KILL_WAIT)
        except asyncio.TimeoutError:  # bwrap itself did not end: kill it too
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            # SIGKILL to our own child ends it; reaping it sets returncode, which run() reads.
            await self.proc.wait()
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None


async def _start_bwrap(code: str, limits: Limits, uid: int, enter: list[str], own_tmp: bool) -> _Run:
    code_fd = _memfd("main.py", code.encode("utf-8", errors="replace"))
    program = seccomp_filter()
    seccomp_fd = _memfd("seccomp", program) if program is not None else None
    info_read, info_write = os.pipe()
    output_read, output_write = os.pipe()
    passed = tuple(fd for fd in (code_fd, info_write, seccomp_fd) if fd is not None)
    try:
        proc = await asyncio.create_subprocess_exec(
            *enter, *bwrap_command(limits, uid, code_fd, info_write, seccomp_fd, own_tmp),
            stdin=asyncio.subprocess.DEVNULL, stdout=output_write, stderr=output_write, pass_fds=passed,
            start_new_session=True)
    except BaseException:
        os.close(info_read)
        os.close(output_read)
        raise
    finally:
        for fd in (*passed, output_write):
            os.close(fd)
    try:
        info = await _read_all(info_read)
    except BaseException:
        os.close(output_read)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return _Run(proc, output_read, _pidfd(info), bwrap=True)


def _memfd(name: str, data: bytes) -> int:
    """An anonymous file holding `data`, read from its start (what bwrap's `--file` and `--seccomp` read)."""
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


async def _start_process(folder: str, limits: Limits, uid: int, enter: list[str]) -> _Run:
    env = {"HOME": folder, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    output_read, output_write = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *enter, *_boot_args(limits, uid, nproc=bool(uid)), cwd=folder, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=output_write, stderr=output_write, start_new_session=True)
    except BaseException:
        os.close(output_read)
        raise
    finally:
        os.close(output_write)
    return _Run(proc, output_read, None, bwrap=False)


async def _read_all(fd: int) -> bytes:
    """Everything written to the pipe `fd` until it closes (bwrap's info), without blocking the loop."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    try:
        return await reader.read()
    finally:
        transport.close()


def _pidfd(info: bytes) -> int | None:
    """A pidfd of the sandbox's first process (from bwrap's info), or None when it did not start."""
    import json

    try:
        pid = int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None
