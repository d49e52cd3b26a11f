"""A cgroup per python sandbox: a memory limit that counts everything the sandbox makes the kernel
hold (its processes, its /tmp, shared memory, the kernel's own objects: inodes, pipes, sockets) and a
process limit.

Found once per process (`home()`): cgroup v2 where agentrl's cgroup hands the `memory` and `pids`
controllers to its children (`cgroup.subtree_control`), else cgroup v1's `memory` (and `pids`, if
mounted) hierarchies where agentrl may make a child of its cgroups (as root, or delegated). Where
neither, `home()` is None and says why in one warning, logged once: the sandbox then holds only
its per-process limits (docs/tools.md gives both bounds).

A sandbox's cgroup (`SandboxCgroup.create(limits)`) is a fresh child with `memory.max` (v1:
`memory.limit_in_bytes`) of `memory_bound_mb(limits)`, no swap, and `pids.max`; the sandbox's
first process moves itself in before it starts bubblewrap (`procs_files`), so that every later
process starts inside; `remove()` kills what is left and removes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
SANDBOX_PROCESSES = 2  # bubblewrap's own two processes (outside and pid 1 of the namespace), in the cgroup too


def memory_bound_mb(max_processes: int, memory_mb: int, disk_mb: int) -> int:
    """The memory a sandbox's cgroup may hold, in MB: each process's address space, plus its /tmp."""
    return max_processes * memory_mb + disk_mb


@dataclass(frozen=True)
class Home:
    """Where sandboxes' cgroups are made: the cgroup version and a parent folder per controller."""

    version: int
    parents: dict[str, Path]  # controller ("memory", "pids") -> the folder children are made in


_HOME: list[Home | None] = []
_HOME_LOCK = threading.Lock()


def home() -> Home | None:
    """Where this process makes sandboxes' cgroups, or None (said once, in one warning line)."""
    with _HOME_LOCK:
        if not _HOME:
            found, why = _find()
            if found is None:
                log.warning("python sandbox: no memory cgroup per sandbox (%s); each holds only its per-process "
                            "limits, a weaker bound (see docs/tools.md)", why)
            _HOME.append(found)
        return _HOME[0]


def _find() -> tuple[Home | None, str]:
    try:
        mine = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as e:
        return None, f"cannot read /proc/self: {e.strerror}"
    paths = {}  # controller (or "" for v2) -> our cgroup's path in its hierarchy
    for line in mine:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path.lstrip("/")
    v2 = _v2(paths, mounts)
    if v2[0] is not None:
        return v2
    v1 = _v1(paths, mounts)
    return v1 if v1[0] is not None else (None, f"{v2[1]}; {v1[1]}")


def _mount_points(mounts: list[str], fstype: str) -> list[tuple[Path, set[str]]]:
    """(mount point, super options) of each mount of `fstype` (/proc/self/mountinfo's fields)."""
    found = []
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) > 4 and len(after) > 2 and after[0] == fstype:
            found.append((Path(fields[4].replace("\\040", " ")), set(after[2].split(","))))
    return found


def _v2(paths: dict[str, str], mounts: list[str]) -> tuple[Home | None, str]:
    points = _mount_points(mounts, "cgroup2")
    if "" not in paths or not points:
        return None, "no cgroup v2"
    parent = points[0][0] / paths[""]
    try:
        have = set((parent / "cgroup.controllers").read_text().split())
        if not {"memory", "pids"} <= have:
            return None, f"cgroup v2 at {parent} lacks the memory and pids controllers (it has: {' '.join(have)})"
        if not {"memory", "pids"} <= set((parent / "cgroup.subtree_control").read_text().split()):
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
        _probe(parent)
    except OSError as e:  # e.g. EBUSY: our own cgroup holds processes, so its children get no controllers
        return None, f"cgroup v2 at {parent} does not hand memory and pids to children ({e.strerror})"
    return Home(2, {"memory": parent, "pids": parent}), ""


def _v1(paths: dict[str, str], mounts: list[str]) -> tuple[Home | None, str]:
    parents: dict[str, Path] = {}
    for point, options in _mount_points(mounts, "cgroup"):
        for c in ("memory", "pids"):
            if c in options and c in paths:
                parents[c] = point / paths[c]
    if "memory" not in parents:
        return None, "no cgroup v1 memory controller"
    for c, parent in list(parents.items()):
        try:
            _probe(parent)
        except OSError as e:
            if c == "memory":
                return None, f"cannot make a cgroup in {parent} ({e.strerror})"
            del parents[c]  # memory alone still bounds memory; RLIMIT_NPROC bounds processes
    return Home(1, parents), ""


def _probe(parent: Path) -> None:
    child = parent / f"agentrl-probe-{os.getpid()}-{secrets.token_hex(4)}"
    child.mkdir()
    child.rmdir()


class SandboxCgroup:
    """One sandbox's cgroup(s): made with its limits, entered by its first process, removed after."""

    def __init__(self, version: int, folders: list[Path]) -> None:
        self.version, self.folders = version, folders

    @classmethod
    def create(cls, max_processes: int, memory_mb: int, disk_mb: int) -> SandboxCgroup | None:
        """A fresh cgroup with the sandbox's limits, or None where this machine has none to give."""
        where = home()
        if where is None:
            return None
        name = f"agentrl-sandbox-{os.getpid()}-{secrets.token_hex(6)}"
        memory = str(memory_bound_mb(max_processes, memory_mb, disk_mb) << 20)
        pids = str(max_processes + SANDBOX_PROCESSES)
        if where.version == 2:
            settings = {"memory": [("memory.max", memory), ("memory.swap.max", "0")], "pids": [("pids.max", pids)]}
        else:  # memsw (memory + swap) only where swap is accounted
            settings = {"memory": [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)],
                        "pids": [("pids.max", pids)]}
        made = cls(where.version, [])
        try:
            for controller, parent in where.parents.items():
                folder = parent / name
                if folder not in made.folders:
                    folder.mkdir()
                    made.folders.append(folder)
                for file, value in settings[controller]:
                    if (folder / file).exists() or file != "memory.memsw.limit_in_bytes":
                        (folder / file).write_text(value)
        except OSError as e:
            made.remove()
            raise OSError(e.errno, f"cannot set up the sandbox's cgroup {name}: {e.strerror}") from e
        return made

    def procs_files(self) -> list[str]:
        """The files a process writes its pid into to move itself into the cgroup(s)."""
        return [str(f / "cgroup.procs") for f in self.folders]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the cgroup for passing its memory limit."""
        events = "memory.events" if self.version == 2 else "memory.oom_control"
        for folder in self.folders:
            with contextlib.suppress(OSError):
                for line in (folder / events).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip() not in ("", "0"):
                        return True
        return False

    def remove(self) -> None:
        """Kill whatever is left in the cgroup(s) and remove them (best effort: a process still exiting
        is waited for a moment)."""
        for folder in self.folders:
            if self.version == 2:
                with contextlib.suppress(OSError):
                    (folder / "cgroup.kill").write_text("1")
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: its last processes are still being reaped
                    time.sleep(0.01)
            else:
                log.warning("python sandbox: could not remove the cgroup %s", folder)
        self.folders = []
