"""Metrics of a training run: stage timers, a logger (console / jsonl / TensorBoard / W&B), curves and summary.

Keys are namespaced: rollout/, reward/, loss/, policy/, perf/, eval/, env/<tag>/.
Heavy libraries (tensorboard, wandb, matplotlib, rich, tqdm) are imported only where used, so
`import agentrl.metrics` stays cheap.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.atomic import write_atomic
from agentrl.errors import ConfigError

if TYPE_CHECKING:  # tqdm is imported where a bar is made (see above)
    from tqdm import tqdm

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
JSONL_NAME, SUMMARY_NAME = "metrics.jsonl", "summary.json"


class Timer:
    """Accumulates wall seconds per named stage until popped."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Time the body and add it to stage `name`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:  # a failing stage still counts: the time was spent
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - t0

    def pop(self) -> dict[str, float]:
        """Return {"perf/time_<stage>": seconds} and reset."""
        out = {f"perf/time_{name}": s for name, s in self._seconds.items()}
        self._seconds = {}
        return out


def _plain(key: str, value: Any) -> int | float:
    """A JSON-safe int/float from a Python, numpy or torch scalar."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        value = value.item() if hasattr(value, "item") else value  # numpy / torch scalars
        return value if isinstance(value, int) and not isinstance(value, bool) else float(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"metric '{key}' must be a number, got {type(value).__name__}: {value!r}") from e


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSON-lines file; a torn last line (run killed mid-write) is skipped."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise
    return rows


class MetricsLogger:
    """The one object a run logs through: metrics.jsonl, TensorBoard, W&B and a progress bar."""

    def __init__(self, run_dir: str | Path, *, loggers: Sequence[str] = LOGGERS[:3], total_steps: int,
                 show_progress: bool = True, resume_from_step: int | None = None, run_name: str = "agentrl",
                 run_config: dict[str, Any] | None = None) -> None:
        unknown = [name for name in loggers if name not in LOGGERS]
        if unknown:
            raise ConfigError(f"unknown logger '{unknown[0]}'; allowed loggers: {', '.join(LOGGERS)}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps = total_steps
        self._rows: list[dict] = []
        self._file = self._open_jsonl(resume_from_step) if "jsonl" in loggers else None
        self._writer = self._open_writer(resume_from_step) if "tensorboard" in loggers else None
        self._wandb = None
        if "wandb" in loggers:
            from agentrl.wandb_sink import WandbSink

            self._wandb = WandbSink(self.run_dir, run_name, run_config, resume=resume_from_step is not None)
        self._bar: tqdm[Any] | None = None
        self._postfix: dict[str, str] = {}  # the bar's last shown values, by name
        if show_progress and "console" in loggers:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=max(resume_from_step or 0, 0), unit="step",
                             dynamic_ncols=True)

    def _open_jsonl(self, resume_from_step: int | None):
        path = self.run_dir / JSONL_NAME
        if path.exists():
            # A fresh run starts an empty file; a resumed one keeps rows up to its step, so
            # the steps it replays are not written twice.
            keep = [] if resume_from_step is None else \
                [r for r in read_jsonl(path) if r.get("step", 0) <= resume_from_step]
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))
        return path.open("a")

    def _open_writer(self, resume_from_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides events a killed run wrote past the resume point, like the jsonl cut.
        purge = None if resume_from_step is None else resume_from_step + 1
        return SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=purge, flush_secs=10)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics in every configured sink."""
        row = {"step": int(step), **{k: _plain(k, v) for k, v in metrics.items()}}
        self._rows.append(row)
        if self._file is not None:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()  # a killed run keeps every line it logged
        if self._writer is not None:
            for key, value in row.items():
                if key != "step":
                    self._writer.add_scalar(key, value, global_step=row["step"])
        if self._wandb is not None:
            self._wandb.log(row)
        if self._bar is not None:
            self._advance_bar(self._bar, row)

    def _advance_bar(self, bar: tqdm[Any], row: dict) -> None:
        # Merge into the last shown values, so a row without one (eval-only) keeps the other.
        self._postfix.update({name: f"{row[key]:.2f}" for name, key in
                              (("reward", "reward/mean"), ("success", "rollout/success")) if key in row})
        if self._postfix:
            bar.set_postfix(self._postfix, refresh=False)
        # Move to `step` rather than +1 per call: eval rows share a step with a train row.
        delta = row["step"] - bar.n
        if delta > 0:
            bar.update(delta)
        else:
            bar.refresh()

    def history(self) -> list[dict]:
        """Rows logged so far by this process."""
        return [dict(r) for r in self._rows]

    def close(self) -> None:
        """Close the bar, the jsonl file, the TensorBoard writer and the W&B run (safe to call twice)."""
        for name in ("_bar", "_file", "_writer", "_wandb"):
            sink = getattr(self, name)
            if sink is not None:
                sink.close()
                setattr(self, name, None)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def plot_curves(rows: list[dict], path: str | Path,
                keys: Sequence[str] = ("reward/mean", "rollout/success", "eval/success")) -> Path | None:
    """Save one PNG with a subplot per present key (value vs step); None when no key is present."""
    present = [k for k in keys if any(k in r for r in rows)]
    if not present:
        return None
    # Figure + Agg canvas, not pyplot: no screen, and no global backend switch for the caller.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 2.4 * len(present)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(present), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, present):
        points = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        if key.startswith("eval/"):  # eval runs only on some steps: show the points themselves
            ax.plot(xs, ys, marker="o", linestyle="--")
        else:
            ax.plot(xs, ys)
        ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_table(summary: dict[str, float | str]) -> str:
    """The summary as a two-column rich table, rendered to plain text."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(str(key), _fmt(value))
    buf = io.StringIO()
    Console(file=buf, width=80, force_terminal=False).print(table)
    return buf.getvalue()


def _json_value(value: Any) -> Any:
    """Plain JSON value: numbers via _plain, NaN/inf as null (strict JSON has neither)."""
    if isinstance(value, (str, type(None))):
        return value
    try:
        value = _plain("summary", value)
    except TypeError:
        return str(value)
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_summary(run_dir: str | Path, summary: dict) -> Path:
    """Write run_dir/summary.json atomically; returns its path."""
    path = Path(run_dir) / SUMMARY_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {str(k): _json_value(v) for k, v in summary.items()}
    write_atomic(path, json.dumps(data, indent=2, allow_nan=False) + "\n")
    return path
