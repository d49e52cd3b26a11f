"""The python sandbox holds the bounds docs/tools.md states, against programs written to break them.

Each hostile program runs through the `python` tool as the tool agent calls it, with
`memory_mb=64, max_processes=1, disk_mb=16`, and prints what it managed to hold as it goes; the
test reads the last figure printed (a program the kernel kills has printed what it held so far)
and checks it against the stated bound, whatever the exit.
"""

import asyncio
import re
import struct

import pytest

from agentrl.errors import ToolError
from agentrl.registry import TOOLS
from agentrl.tools import cgroup, seccomp
from agentrl.tools.sandbox import TMP_FILES, _can_mount_tmp
from helpers import bwrap_problem

PROBLEM = bwrap_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap cannot run here: {PROBLEM}")

MEMORY_MB, PROCESSES, DISK_MB = 64, 1, 16
BOUND = cgroup.memory_bound_mb(PROCESSES, MEMORY_MB, DISK_MB) << 20  # docs/tools.md: processes × memory + /tmp


def run_hostile(code: str) -> str:
    """What the program printed, run by the python tool as an agent calls it, whether it ended well or not."""
    tool = TOOLS.get("python").configure({"timeout": 60.0, "cpu_seconds": 20, "memory_mb": MEMORY_MB,
                                          "max_processes": PROCESSES, "disk_mb": DISK_MB, "max_output": 4096},
                                         "tool_args.python")
    try:
        return asyncio.run(tool.run({"code": code}))
    except ToolError as e:
        return str(e)


def last(name: str, printed: str) -> int:
    """The last figure the program printed after `name`."""
    figures = re.findall(rf"^{name} (\d+)$", printed, re.M)
    assert figures, f"the program printed no {name!r} figure: {printed!r}"
    return int(figures[-1])


MEMFD = """import os
held, files = 0, []
for i in range(20):
    try:
        fd = os.memfd_create(f"m{i}")
        for _ in range(16):
            os.write(fd, b"x" * (1 << 20))
    except OSError as e:
        print("stopped:", e.strerror)
        break
    files.append(fd)  # kept open: its 16 MB stay held
    held += os.fstat(fd).st_size
    print("held", held, flush=True)
print("held", held)
"""

SYSV = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
held = 0
for i in range(8):
    sid = libc.shmget(0, 32 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if sid < 0:
        print("stopped:", ctypes.get_errno())
        break
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, 32 << 20)
    libc.shmdt(ctypes.c_void_p(addr))  # detached, the segment stays in the IPC namespace
    held += 32 << 20
    print("held", held, flush=True)
print("held", held)
print("msgget", ctypes.get_errno() if libc.msgget(0, 0o1000 | 0o600) < 0 else 0)
print("semget", ctypes.get_errno() if libc.semget(0, 1, 0o1000 | 0o600) < 0 else 0)
"""

FILES = """import os
n = 0
try:
    while n < 100000:
        os.close(os.open(f"/tmp/f{n}", os.O_CREAT | os.O_WRONLY, 0o600))
        n += 1
        if n % 1000 == 0:
            print("files", n, flush=True)
except OSError as e:
    print("stopped:", e.strerror)
print("files", n)
"""

KERNEL = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
arm = os.uname().machine == "aarch64"
def errno_of(result):
    return 0 if result >= 0 else ctypes.get_errno()
print("unshare", errno_of(libc.unshare(0x10000000)))  # CLONE_NEWUSER
print("clone", errno_of(libc.syscall(220 if arm else 56, 0x10000000 | 17, 0, 0, 0, 0)))  # CLONE_NEWUSER | SIGCHLD
print("mount", errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, b"size=4g")))
print("ptrace", errno_of(libc.ptrace(0, 0, None, None)))  # PTRACE_TRACEME
print("keyctl", errno_of(libc.syscall(219 if arm else 250, 1, 0)))  # KEYCTL_JOIN_SESSION_KEYRING
print("bpf", errno_of(libc.syscall(280 if arm else 321, 0, None, 0)))
"""

PIPES_AND_MEMORY = """import fcntl, os
held = 0
with open("/tmp/big", "wb") as f:  # /tmp: 15 of its 16 MB
    for _ in range(15):
        f.write(b"x" * (1 << 20))
        held += 1 << 20
print("held", held, flush=True)
pipes = []
try:
    for _ in range(60):  # kernel buffers: no address space limit counts them
        r, w = os.pipe()
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        os.set_blocking(w, False)
        held += os.write(w, b"x" * (1 << 20))
        pipes.append((r, w))
        print("held", held, flush=True)
except OSError as e:
    print("stopped:", e.strerror)
blocks = []
try:
    while True:
        blocks.append(bytearray(1 << 20))
        held += 1 << 20
        print("held", held, flush=True)
except MemoryError:
    print("stopped: MemoryError")
print("held", held)
"""


@needs_bwrap
def test_memfd_files_cannot_hold_more_than_the_bound():
    printed = run_hostile(MEMFD)
    assert last("held", printed) <= BOUND, printed  # before: 20 × 16 MB = 320 MB held
    assert "stopped: Operation not permitted" in printed  # memfd_create is refused outright


@needs_bwrap
def test_sysv_ipc_cannot_hold_more_than_the_bound():
    printed = run_hostile(SYSV)
    assert last("held", printed) <= BOUND, printed  # before: 8 × 32 MB = 256 MB held
    assert last("msgget", printed) == last("semget", printed) == 1  # EPERM: no SysV IPC at all


@needs_bwrap
def test_tmp_holds_a_bounded_count_of_files():
    if not _can_mount_tmp() and cgroup.home() is None:
        pytest.skip("neither /tmp's file count (as root) nor a memory cgroup bounds this here (docs/tools.md)")
    files = last("files", run_hostile(FILES))
    if _can_mount_tmp():
        assert files <= TMP_FILES  # before: all 100,000 (123 MB of kernel memory)
    else:  # the memory cgroup counts each file's inode: 100,000 of them exceed its bound
        assert files < 100000


@needs_bwrap
def test_tmp_pipes_and_memory_together_stay_within_the_cgroup_bound():
    if cgroup.home() is None:
        pytest.skip("no memory cgroup here: the weaker bound of docs/tools.md holds instead")
    printed = run_hostile(PIPES_AND_MEMORY)
    assert last("held", printed) <= BOUND, printed  # before: 122 MB (15 in /tmp, 60 in pipes, the rest allocated)
    if "stopped: MemoryError" not in printed:  # killed at the cgroup's limit, and told so
        assert f"held more than the sandbox's {BOUND >> 20} MB of memory and was killed" in printed


@needs_bwrap
def test_no_namespace_mount_ptrace_bpf_or_keyring_call_gets_through():
    printed = run_hostile(KERNEL)
    # before: a nested user namespace, with every capability in it, and a session keyring
    assert {call: last(call, printed) for call in ("unshare", "clone", "mount", "ptrace", "keyctl", "bpf")} == {
        "unshare": 1, "clone": 1, "mount": 1, "ptrace": 1, "keyctl": 1, "bpf": 1}  # EPERM each


@needs_bwrap
def test_threads_and_subprocesses_still_run_under_the_filter():
    tool = TOOLS.get("python").configure({"timeout": 60.0}, "tool_args.python")
    code = ("import subprocess, sys, threading\nt = threading.Thread(target=print, args=('thread',))\nt.start()\n"
            "t.join()\nprint(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True,"
            " text=True).stdout, end='')\n")
    assert asyncio.run(tool.run({"code": code})) == "thread\n42\n"  # clone3 refused: the C library falls back


def evaluate(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What the classic-BPF `program` returns for one call: the instructions the filter uses, run as
    the kernel runs them over `struct seccomp_data` (a slow reference of the kernel's check)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    ins = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # ret k
            return k
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += jt if hit else jf
        else:
            raise AssertionError(f"instruction {code:#x} not expected")
        pc += 1


ALLOW, KILL, EPERM, ENOSYS = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_refuses_what_it_says_and_allows_the_rest(machine):
    program = seccomp.filter_program(machine)
    assert len(program) % 8 == 0 and len(program) // 8 < 4096  # struct sock_filter[], within the kernel's limit
    arch, nrs = seccomp.ARCHITECTURES[machine]
    for call in seccomp.REFUSED:
        assert evaluate(program, nrs[call], arch) == EPERM, call
    assert evaluate(program, nrs["clone3"], arch) == ENOSYS  # the C library falls back to clone
    for ns in (seccomp.CLONE_NEWUSER, seccomp.CLONE_NEWNS, seccomp.CLONE_NEWNET, seccomp.CLONE_NEWPID):
        assert evaluate(program, nrs["clone"], arch, ns | 17) == EPERM
        assert evaluate(program, nrs["unshare"], arch, ns) == EPERM
    assert evaluate(program, nrs["unshare"], arch, seccomp.CLONE_NEWTIME) == EPERM
    thread = 0x3D0F00  # CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | ...: pthread_create
    assert evaluate(program, nrs["clone"], arch, thread) == ALLOW
    assert evaluate(program, nrs["clone"], arch, 0x80 | 17) == ALLOW  # exit signal bits, not CLONE_NEWTIME
    assert evaluate(program, nrs["unshare"], arch, 0x400) == ALLOW  # CLONE_FILES: no namespace
    assert evaluate(program, 0, arch) == ALLOW  # read (x86_64) / io_setup (aarch64)
    assert evaluate(program, 0, 0x40000003) == KILL  # another architecture (i386's int 0x80)
    if machine == "x86_64":
        assert evaluate(program, 0x40000000 | 272, arch) == KILL  # x32's unshare
    with pytest.raises(ValueError, match="no seccomp filter for architecture 'mips'"):
        seccomp.filter_program("mips")
