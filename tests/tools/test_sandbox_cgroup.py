"""Where the python sandbox finds its cgroups, and the one line it logs where there are none."""

import logging

from agentrl.registry import TOOLS
from agentrl.tools import cgroup
from agentrl.tools import python as python_tool


def test_without_cgroups_the_tool_says_so_in_one_line_once(monkeypatch, caplog):
    monkeypatch.setattr(cgroup, "_HOME", [])
    monkeypatch.setattr(cgroup, "_find", lambda: (None, "no cgroup v2; no cgroup v1 memory controller"))
    monkeypatch.setattr(python_tool, "_WORKS", {"process"})  # the sandbox itself is not what is tested here
    with caplog.at_level(logging.WARNING, logger="agentrl.tools.cgroup"):
        for _ in range(3):
            TOOLS.get("python").configure({"sandbox": "process"}, "tool_args.python").start()
            assert cgroup.SandboxCgroup.create(1, 64, 16) is None
    said = [r.getMessage() for r in caplog.records if r.name == "agentrl.tools.cgroup"]
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith("python sandbox: no memory cgroup per sandbox (no cgroup v2; no cgroup v1 memory")


def test_a_cgroup_v2_that_delegates_memory_and_pids_gets_each_sandbox_its_limits(monkeypatch, tmp_path):
    """cgroup v2 (which this machine may lack) from its files: agentrl's cgroup at /agentrl under the mount."""
    ours = tmp_path / "agentrl"
    ours.mkdir()
    (ours / "cgroup.controllers").write_text("cpu memory pids\n")
    (ours / "cgroup.subtree_control").write_text("memory pids\n")
    mountinfo = [f"35 24 0:30 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"]
    home, why = cgroup._v2({"": "agentrl"}, mountinfo)
    assert why == "" and home == cgroup.Home(2, {"memory": ours, "pids": ours})
    monkeypatch.setattr(cgroup, "_HOME", [home])
    made = cgroup.SandboxCgroup.create(max_processes=2, memory_mb=64, disk_mb=16)
    (folder,) = made.folders
    assert folder.parent == ours
    assert {f: (folder / f).read_text() for f in ("memory.max", "memory.swap.max", "pids.max")} == {
        "memory.max": str((2 * 64 + 16) << 20), "memory.swap.max": "0", "pids.max": "4"}
    assert made.procs_files() == [str(folder / "cgroup.procs")]
    (ours / "cgroup.controllers").write_text("cpu\n")
    assert cgroup._v2({"": "agentrl"}, mountinfo) == (
        None, f"cgroup v2 at {ours} lacks the memory and pids controllers (it has: cpu)")
