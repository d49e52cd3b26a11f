"""The scale request of a Ray run: how many engine replicas its user wants, as a small JSON file in
the run folder that trainer rank 0 reads at each step boundary (runtime/ray/elastic.py).

    RUN_DIR/scale.json   {"engines": 3, "id": "<random hex>"}

Written whole or not at all (agentrl/atomic.py), by `agentrl scale RUN_DIR engines=N` or
`RayRun.scale(n)`; N is plain ASCII digits, 1 to MAX_ENGINES. It is the wanted state, not a one-off
order: it stays in the folder, so a run resumed later is scaled to it at its first step. Imports nothing heavy: the CLI
writes it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from agentrl.atomic import write_atomic
from agentrl.errors import AgentRLError, ConfigError, shown

SCALE_NAME = "scale.json"
TARGET = "engines"  # the one thing a request scales
MAX_ENGINES = 1024  # the most replicas a request may ask: a typo (engines=1000000000) is refused, not tried


def engines_target(targets: list[str]) -> int:
    """N of the one `engines=N` of the command line; one line naming what is wrong otherwise."""
    if len(targets) != 1:
        got = f"got {' '.join(targets)!r}" if targets else "got nothing"
        raise ConfigError(f"give one target, engines=N (the engine replicas the run should have), {got}")
    key, eq, value = targets[0].partition("=")
    if not eq or key != TARGET:
        raise ConfigError(f"unknown scale target {targets[0]!r}: the one accepted is engines=N, e.g. engines=2")
    # Plain ASCII digits only: int() also takes "1_000", " 3", "+3" and other scripts' digits ("３").
    n = int(value) if value.isascii() and value.isdigit() and len(value) <= 9 else 0
    return check_engines(n, given=value)


def check_engines(n: object, given: object = None) -> int:
    """`n` as a replica count: a whole number from 1 to MAX_ENGINES."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ENGINES:
        value = n if given is None else given
        if not (isinstance(value, str) and value.isascii() and value.isprintable() and len(value) <= 40):
            value = shown(value)
        raise ConfigError(f"engines={value}: give a whole number of engine replicas, at least 1 and at most "
                          f"{MAX_ENGINES}, in plain digits (e.g. engines=2)")
    return n


def check_ray_run(run_dir: Path, engines: int | None = None) -> None:
    """`run_dir` (a run folder) holds a runtime.kind=ray run: only those have replicas to scale;
    and one that can hold `engines` replicas (those beyond its placement need resources to reserve)."""
    from agentrl.config import load_config

    cfg = load_config(run_dir / "config.yaml")
    kind = cfg.runtime.kind
    if kind != "ray":
        raise ConfigError(f"{run_dir} is a runtime.kind={kind} run: only a Ray run (runtime.kind=ray) has engine "
                          "replicas to scale")
    from agentrl.runtime.assembly.engine_kinds import engine_kind
    from agentrl.runtime.assembly.envs import import_user_modules

    import_user_modules(cfg.imports)  # a user's module may register the kind
    if engine_kind(cfg.engine.kind).served:
        raise ConfigError(f"{run_dir} generates on engine.kind={cfg.engine.kind}: only the Ray run's own engine "
                          "replicas (engine.kind=local) are scaled; start or stop the servers yourself")
    infer = cfg.runtime.actor_infer
    if isinstance(engines, int) and engines > infer.world_size and not infer.num_cpus and not infer.device_mapping:
        raise ConfigError(f"engines={engines}: {run_dir} runs its engines with runtime.actor_infer.num_cpus=0 on CPU, "
                          "so a replica beyond the "
                          f"{infer.world_size} placed (runtime.actor_infer.world_size) reserves nothing and nothing "
                          "bounds how many the cluster would take; ask at most "
                          f"engines={infer.world_size}, or run with runtime.actor_infer.num_cpus > 0")


def request_scale(run_dir: str | Path, engines: int) -> Path:
    """Ask the run in `run_dir` for `engines` replicas (applied at its next step boundary)."""
    n = check_engines(engines)
    body = json.dumps({TARGET: n, "id": uuid.uuid4().hex})  # a new id: the same count asked again is retried
    path = Path(run_dir) / SCALE_NAME
    try:
        return write_atomic(path, body + "\n")
    except OSError as e:
        raise AgentRLError(f"cannot write the scale request {path}: {e.strerror or e}; the run folder must be "
                           "writable by this user (the run reads its requests from there)") from None


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
