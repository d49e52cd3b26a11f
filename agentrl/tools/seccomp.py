"""The python sandbox's seccomp filter: a classic-BPF program that refuses the kernel's riskiest calls.

`filter_program()` returns the compiled program (`struct sock_filter[]`, as bubblewrap's `--seccomp
FD` reads it) for the machine's architecture, x86_64 or aarch64. It is written here against the
kernel's documented layout (Documentation/userspace-api/seccomp_filter.rst: `struct seccomp_data`
is `int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]`) rather than through libseccomp,
whose Python binding does not install into a pip virtualenv.

What it refuses, with EPERM (the code sees an ordinary "Operation not permitted"):
- new namespaces: `unshare` and `clone` with any `CLONE_NEW*` flag (a nested user namespace gives
  every capability in it: the start of most container escapes), `setns`; `clone3` answers ENOSYS
  (its flags sit behind a pointer the filter cannot read), so the C library falls back to `clone`;
- mounts (`mount`, `umount2`, `pivot_root`, `chroot` and the new mount API), `ptrace` and
  `process_vm_readv/writev`, `kexec_*`, `bpf`, `perf_event_open`, the keyring (`keyctl`, `add_key`,
  `request_key`), modules, `reboot`, `swapon/off`, `userfaultfd`, `io_uring_*`, file handles,
  clock and host name changes, `syslog`, `acct`, `quotactl`, `pidfd_getfd`;
- memory a process holds outside its address space limit: `memfd_create` and `memfd_secret`
  (only the open-file and file-size limits would bound them, 64 × `disk_mb`; nothing a model's
  program needs), SysV shared memory, message queues and semaphores (`shmget`, `msgget`, `semget`:
  their segments outlive the process that made them), and POSIX message queues (`mq_open`).
Another architecture's calls (a 32-bit `int 0x80` on x86_64, or x32) kill the process.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data offsets; the low 32 bits of args[0] (both architectures are little-endian)
_NR, _ARCH, _ARG0 = 0, 4, 16
# classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h)
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_X32_BIT = 0x40000000  # x86_64's x32 ABI: the same numbers with this bit set

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x00000080
# CLONE_NEWTIME's bit is part of the exit signal in clone's flags: only unshare takes it
_CLONE_NS = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
_UNSHARE_NS = _CLONE_NS | CLONE_NEWTIME

REFUSED = ("setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
           "open_tree", "move_mount", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev",
           "kexec_load", "kexec_file_load", "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
           "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "userfaultfd",
           "io_uring_setup", "io_uring_enter", "io_uring_register", "name_to_handle_at", "open_by_handle_at",
           "pidfd_getfd", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
           "setdomainname", "syslog", "acct", "quotactl", "memfd_create", "memfd_secret", "shmget", "msgget",
           "semget", "mq_open")

# syscall numbers (x86_64, aarch64) from the kernel's unistd headers
_NUMBERS = {
    "clone": (56, 220), "clone3": (435, 435), "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40),
    "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "open_tree": (428, 428),
    "move_mount": (429, 429), "mount_setattr": (442, 442), "ptrace": (101, 117), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "kexec_load": (246, 104), "kexec_file_load": (320, 294), "bpf": (321, 280),
    "perf_event_open": (298, 241), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106), "reboot": (169, 142),
    "swapon": (167, 224), "swapoff": (168, 225), "userfaultfd": (323, 282), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265), "pidfd_getfd": (438, 438), "settimeofday": (164, 170),
    "clock_settime": (227, 112), "clock_adjtime": (305, 266), "adjtimex": (159, 171), "sethostname": (170, 161),
    "setdomainname": (171, 162), "syslog": (103, 116), "acct": (163, 89), "quotactl": (179, 60),
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "shmget": (29, 194), "msgget": (68, 186),
    "semget": (64, 190), "mq_open": (240, 180)}
# (audit architecture, syscall numbers)
_X86_64 = (0xC000003E, {call: numbers[0] for call, numbers in _NUMBERS.items()})
_AARCH64 = (0xC00000B7, {call: numbers[1] for call, numbers in _NUMBERS.items()})
ARCHITECTURES = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}


def supported(machine: str | None = None) -> bool:
    """Whether a filter can be built for this machine's architecture (`platform.machine()`)."""
    return (machine or platform.machine()).lower() in ARCHITECTURES


def filter_program(machine: str | None = None) -> bytes:
    """The compiled filter for `machine` (default: this one), as bubblewrap's `--seccomp` reads it."""
    name = (machine or platform.machine()).lower()
    if name not in ARCHITECTURES:
        raise ValueError(f"no seccomp filter for architecture {name!r}: expected one of {', '.join(ARCHITECTURES)}")
    arch, nrs = ARCHITECTURES[name]
    refuse = _ERRNO | errno.EPERM
    prog = [(_LD_ABS, 0, 0, _ARCH), (_JEQ, 1, 0, arch), (_RET, 0, 0, _KILL_PROCESS), (_LD_ABS, 0, 0, _NR)]
    if arch == _X86_64[0]:
        prog += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, _KILL_PROCESS)]
    prog += [(_JEQ, 0, 1, nrs["clone3"]), (_RET, 0, 0, _ERRNO | errno.ENOSYS)]
    for call, flags in (("clone", _CLONE_NS), ("unshare", _UNSHARE_NS)):  # a namespace flag in args[0]: refused
        prog += [(_JEQ, 0, 4, nrs[call]), (_LD_ABS, 0, 0, _ARG0), (_JSET, 0, 1, flags), (_RET, 0, 0, refuse),
                 (_RET, 0, 0, _ALLOW)]
    for call in REFUSED:
        prog += [(_JEQ, 0, 1, nrs[call]), (_RET, 0, 0, refuse)]
    prog.append((_RET, 0, 0, _ALLOW))
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)
