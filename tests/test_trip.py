"""The trip a reader takes from `build_trainer(cfg)`: how many of the package's files it enters.

The build of the default config (tiny sizes, so it takes seconds) runs in a fresh interpreter
under `sys.setprofile`, which sees every Python function call. The embedded model's warm start
(its own room, warm_start/, entered once through `load_policy`) is built and cached by a first,
untraced build: the trip is the one a reader follows through every later run, as the issue's
earlier counts were. Counted, over the package's own files
(`agentrl/**.py`) only:

- files entered: the files in which at least one function was called, in order of first entry;
- crossings: calls whose caller is in another file; the caller is the nearest frame of a package
  file below the callee (a library in between, e.g. torch calling a module's `forward`, is looked
  through). Counted as distinct (caller file, callee file) pairs and as a total of calls;
- climbs: the crossings into a file the trip entered before it entered the caller's file (a call
  back up to a file already on the visited list, which the trip had left for the caller's);
  counted as distinct pairs and as a total.

Traced: the build's thread and the threads it starts (the warm start's episodes run on an event
loop thread of their own), until build_trainer returns. Calls made while a module is being
imported (a module body on the stack: registrations, module-level constants) are not part of the
trip. A fresh interpreter makes the counts independent of what other tests imported or cached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Issue 45 asks for at most 32 files; measured this way the trip enters 45 (40 before the engine kinds,
# the episode loop and the warm start got rooms of their own). The bar is what it enters now, so that
# the trip does not grow again unnoticed; the target is not reached.
MOST_FILES = 45
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
        "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
        "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
        "trainer.total_steps=1", "trainer.progress=false"]


def trace_build(run_dir: Path) -> dict[str, Any]:
    """Build the default config's trainer under the profiler; the trip's counts (module docstring)."""
    import agentrl
    from agentrl.config import load_config
    from agentrl.runtime.assembly.trainer import build_trainer

    package = str(Path(agentrl.__file__).resolve().parent) + os.sep
    cfg = load_config(None, [*TINY, f"run_dir={run_dir / 'run'}", f"model.cache_dir={run_dir / 'cache'}"])
    ours: dict[str, str | None] = {}  # code file -> path inside the package (None: not ours)

    def own(frame: FrameType) -> str | None:
        name = frame.f_code.co_filename
        if name not in ours:
            path = os.path.realpath(name)
            ours[name] = path[len(package):] if path.startswith(package) else None
        return ours[name]

    entered: list[str] = []
    seen: set[str] = set()
    crossings: dict[tuple[str, str], int] = {}

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":
            return
        callee = own(frame)
        if callee is None:
            return
        caller, back = None, frame.f_back
        while back is not None and back is not start:
            if back.f_code.co_name == "<module>":
                return  # an import's work, not the trip's
            caller = caller or own(back)
            back = back.f_back
        if callee not in seen:
            seen.add(callee)
            entered.append(callee)
        if caller is not None and caller != callee:
            crossings[caller, callee] = crossings.get((caller, callee), 0) + 1

    start = sys._getframe()  # the frames below the build are the test's
    built = threading.Event()

    def in_thread(frame: FrameType, event: str, arg: object) -> None:
        if not built.is_set():  # a thread the build started may outlive it
            profile(frame, event, arg)

    build_trainer(cfg, run_dir / "warm", log=lambda m: None).rollout.shutdown()  # caches the warm start
    sys.setprofile(profile)
    threading.setprofile(in_thread)
    try:
        trainer = build_trainer(cfg, run_dir / "run", log=lambda m: None)
    finally:
        built.set()
        sys.setprofile(None)
        threading.setprofile(None)
    trainer.rollout.shutdown()
    climbs = {pair: n for pair, n in crossings.items() if entered.index(pair[1]) < entered.index(pair[0])}
    return {"files": entered, "crossing_pairs": len(crossings), "crossings": sum(crossings.values()),
            "climb_pairs": len(climbs), "climbs": sum(climbs.values()),
            "climbed": sorted(f"{a} -> {b}" for a, b in climbs)}


def test_the_trip_from_build_trainer_enters_no_more_files_than_it_does_now(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    trip = json.loads(done.stdout.splitlines()[-1])
    files = trip["files"]
    print(f"files entered {len(files)}, crossings {trip['crossing_pairs']} pairs ({trip['crossings']} calls), "
          f"climbs {trip['climb_pairs']} pairs ({trip['climbs']} calls)")
    print("\n".join(f"  {i + 1:2d} {f}" for i, f in enumerate(files)))
    assert files[0] == "runtime/assembly/trainer.py"
    assert len(files) <= MOST_FILES, f"the trip enters {len(files)} files, at most {MOST_FILES}: {files}"


if __name__ == "__main__":
    print(json.dumps(trace_build(Path(sys.argv[1]))))
