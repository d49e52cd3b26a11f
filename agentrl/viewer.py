"""`agentrl view RUN_DIR`: one self-contained page over a run's trajectory dumps and curves.

The page (`RUN_DIR/view.html`) is the template `viewer.html` with the run's data inlined as JSON
blocks: no script, style or font comes from anywhere else, so it opens from disk on a machine
with no network. What it holds:
- the curves of metrics.jsonl (a chosen set of keys and every health/ key, at most
  `MAX_POINTS` points each) and the steps where a collapse alarm fired;
- the dumps of at most `max_steps` steps, evenly spaced over the run with the first and the
  last among them; each step is a JSON block of its own, parsed only when picked, so a page
  with many steps opens as fast as one with a few. The other steps are listed; `--serve`
  serves the page on loopback with the standard library, and there the page fetches any step
  on demand (`/dumps/<step>.json`), so every step of a long run can be browsed.

It imports neither torch nor the trainer: viewing a run is cheap.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agentrl.atomic import write_atomic
from agentrl.dumps import dump_path, list_dumps, read_dump
from agentrl.errors import AgentRLError
from agentrl.metrics import JSONL_NAME, read_jsonl

PAGE_NAME = "view.html"
TEMPLATE = Path(__file__).with_name("viewer.html")
MAX_POINTS = 2000  # per curve: a long run's curve is thinned to this many points
CURVE_KEYS = ("reward/mean", "rollout/success", "eval/success", "policy/entropy", "loss/policy", "policy/grad_norm",
              "policy/logprob_diff_mean", "rollout/staleness_mean", "rollout/response_tokens")


def _script(block_id: str, data: Any) -> str:
    # "<" escaped inside the JSON, so no "</script>" in a decoded piece can end the block early.
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    return f'<script type="application/json" id="{block_id}">{text}</script>'


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def curves(rows: list[dict]) -> tuple[dict[str, list[list[float | None]]], list[int]]:
    """{key: [[step, value], ...]} of the curves the page draws, and the steps with an alarm."""
    keys = [k for k in CURVE_KEYS if any(k in r for r in rows)]
    keys += sorted({k for r in rows for k in r if k.startswith("health/") and not k.startswith("health/alarm")})
    out = {}
    for key in keys:
        points = [[r["step"], _finite(r[key])] for r in rows if key in r and "step" in r]
        thin = points[::max(1, math.ceil(len(points) / MAX_POINTS))]
        out[key] = thin if thin[-1] == points[-1] else [*thin, points[-1]]  # the last value is always drawn
    alarms = sorted({int(r["step"]) for r in rows if r.get("health/alarms", 0) > 0})
    return out, alarms


def pick_steps(steps: list[int], max_steps: int) -> list[int]:
    """At most `max_steps` of `steps`, evenly spaced, the first and the last among them."""
    if len(steps) <= max_steps:
        return list(steps)
    if max_steps == 1:
        return [steps[-1]]
    picks = {steps[round(k * (len(steps) - 1) / (max_steps - 1))] for k in range(max_steps)}
    return sorted(picks)


def build_page(run_dir: str | Path, max_steps: int = 20, warn: Callable[[str], None] = print) -> str:
    """The page's HTML for `run_dir`."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() and not (run_dir / JSONL_NAME).is_file():
        raise AgentRLError(f"{run_dir} is not a run folder (no config.yaml or {JSONL_NAME}); give the folder a "
                           "run wrote")
    if max_steps < 1:
        raise AgentRLError(f"--max-steps={max_steps} must be at least 1")
    rows = read_jsonl(run_dir / JSONL_NAME) if (run_dir / JSONL_NAME).is_file() else []
    curve_data, alarm_steps = curves(rows)
    dumps = list_dumps(run_dir)
    inline = set(pick_steps([s for s, _ in dumps], max_steps))
    blocks = []
    for step, path in dumps:
        if step in inline:
            try:
                blocks.append(_script(f"agentrl-step-{step}", read_dump(path)))
            except (OSError, ValueError, EOFError) as e:  # a damaged file costs its step only
                warn(f"agentrl view: skipping unreadable dump {path.name}: {e}")
                inline.discard(step)
    index = {
        "run": {"name": _run_name(run_dir), "dir": str(run_dir),
                "steps_logged": max((int(r["step"]) for r in rows), default=0)},
        "steps": [{"step": s, "inlined": s in inline, "alarm": s in alarm_steps} for s, _ in dumps],
        "inlined": len(inline), "curves": curve_data, "alarm_steps": alarm_steps,
    }
    data = "\n".join([_script("agentrl-index", index), *blocks])
    return TEMPLATE.read_text(encoding="utf-8").replace("<!--AGENTRL_DATA-->", data, 1)


def _run_name(run_dir: Path) -> str:
    config = run_dir / "config.yaml"
    if config.is_file():
        import yaml

        try:
            name = (yaml.safe_load(config.read_text()) or {}).get("exp_name")
        except yaml.YAMLError:
            name = None
        if name:
            return str(name)
    return run_dir.name


def write_page(run_dir: str | Path, max_steps: int = 20, warn: Callable[[str], None] = print) -> Path:
    """Write RUN_DIR/view.html (atomically) and return its path."""
    path = Path(run_dir) / PAGE_NAME
    write_atomic(path, build_page(run_dir, max_steps, warn))
    return path


class _Handler(BaseHTTPRequestHandler):
    run_dir: Path
    page: Path

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        route = self.path.split("?", 1)[0]
        if route in ("/", "/" + PAGE_NAME):
            return self._send(200, "text/html; charset=utf-8", self.page.read_bytes())
        if route.startswith("/dumps/") and route.endswith(".json"):
            name = route[len("/dumps/"):-len(".json")]
            path = dump_path(self.run_dir, int(name)) if name.isdigit() else None
            if path is not None and path.is_file():
                body = json.dumps(read_dump(path), separators=(",", ":")).encode()
                return self._send(200, "application/json", body)
            return self._send(404, "text/plain", f"no dump for step {name!r}\n".encode())
        return self._send(404, "text/plain", b"not found: the page is at /\n")

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the standard library's parameter name)
        pass  # quiet: the terminal shows the URL, not a line per request


def make_server(run_dir: str | Path, page: Path, port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A loopback HTTP server for the page and every dump of `run_dir` (port 0: any free one)."""
    handler = type("Handler", (_Handler,), {"run_dir": Path(run_dir), "page": Path(page)})
    try:
        return ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        raise AgentRLError(f"cannot serve on {host}:{port}: {e.strerror or e}; pick another --port") from None


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    """Serve `server` from a daemon thread (tests, notebooks); stop with server.shutdown()."""
    thread = threading.Thread(target=server.serve_forever, name="agentrl-view", daemon=True)
    thread.start()
    return thread
