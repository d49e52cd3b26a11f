"""The scale request of a Ray run: how many engine replicas its user wants, as a small JSON file in
the run folder that trainer rank 0 reads at each step boundary (runtime/ray/elastic.py).

    RUN_DIR/scale.json   {"engines": 3, "id": "<random hex>"}

Written whole or not at all (agentrl/atomic.py), by `agentrl scale RUN_DIR engines=N` or
`RayRun.scale(n)`. It is the wanted state, not a one-off order: it stays in the folder, so a run
resumed later is scaled to it at its first step. Imports nothing heavy: the CLI writes it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from agentrl.atomic import write_atomic
from agentrl.errors import ConfigError

SCALE_NAME = "scale.json"
TARGET = "engines"  # the one thing a request scales


def engines_target(targets: list[str]) -> int:
    """N of the one `engines=N` of the command line; one line naming what is wrong otherwise."""
    if len(targets) != 1:
        got = f"got {' '.join(targets)!r}" if targets else "got nothing"
        raise ConfigError(f"give one target, engines=N (the engine replicas the run should have), {got}")
    key, eq, value = targets[0].partition("=")
    if not eq or key != TARGET:
        raise ConfigError(f"unknown scale target {targets[0]!r}: the one accepted is engines=N, e.g. engines=2")
    try:
        n = int(value)
    except ValueError:
        n = 0
    return check_engines(n, shown=value)


def check_engines(n: object, shown: object = None) -> int:
    """`n` as a replica count: a whole number >= 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"engines={n if shown is None else shown}: give a whole number of engine replicas, "
                          "at least 1 (e.g. engines=2)")
    return n


def check_ray_run(run_dir: Path) -> None:
    """`run_dir` (a run folder) holds a runtime.kind=ray run: only those have replicas to scale."""
    from agentrl.config import load_config

    cfg = load_config(run_dir / "config.yaml")
    kind = cfg.runtime.kind
    if kind != "ray":
        raise ConfigError(f"{run_dir} is a runtime.kind={kind} run: only a Ray run (runtime.kind=ray) has engine "
                          "replicas to scale")
    if cfg.engine.kind != "local":
        raise ConfigError(f"{run_dir} generates on engine.kind={cfg.engine.kind}: only the Ray run's own engine "
                          "replicas (engine.kind=local) are scaled; start or stop the servers yourself")
    if cfg.rollout.max_staleness:
        raise ConfigError(f"{run_dir} plays asynchronously (rollout.max_staleness={cfg.rollout.max_staleness}): "
                          "replicas are added and removed between on-policy steps only (not built for a stream "
                          "of groups in flight yet)")


def request_scale(run_dir: str | Path, engines: int) -> Path:
    """Ask the run in `run_dir` for `engines` replicas (applied at its next step boundary)."""
    n = check_engines(engines)
    body = json.dumps({TARGET: n, "id": uuid.uuid4().hex})  # a new id: the same count asked again is retried
    return write_atomic(Path(run_dir) / SCALE_NAME, body + "\n")


def read_request(run_dir: str | Path) -> tuple[str, int] | None:
    """(id, engines) of the run folder's request; None when there is none. A file that is not a
    request (edited by hand) is a ValueError naming it."""
    path = Path(run_dir) / SCALE_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        n = data[TARGET]
        check_engines(n)
        return str(data.get("id", "")), n
    except (ValueError, TypeError, KeyError, ConfigError) as e:
        raise ValueError(f"{path} is not a scale request ({e}); write it with `agentrl scale RUN_DIR engines=N`") \
            from None
