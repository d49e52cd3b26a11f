"""Tests of agentrl.metrics: sinks, resume, plots, summary and timers."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.metrics import (MetricsLogger, Timer, plot_curves, read_jsonl, summary_table,
                             write_summary)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _logger(tmp_path, **kw) -> MetricsLogger:
    kw.setdefault("loggers", ["jsonl"])
    return MetricsLogger(tmp_path, total_steps=10, show_progress=False, **kw)


def test_jsonl_round_trip_converts_scalars(tmp_path):
    with _logger(tmp_path) as log:
        log.log(1, {"reward/mean": np.float32(0.5), "loss/pg": torch.tensor(2.25),
                    "rollout/n": np.int64(7), "rollout/success": 1.0})
        log.log(2, {"reward/mean": 0.75})
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows == [{"step": 1, "reward/mean": 0.5, "loss/pg": 2.25, "rollout/n": 7, "rollout/success": 1.0},
                    {"step": 2, "reward/mean": 0.75}]
    assert type(rows[0]["rollout/n"]) is int and type(rows[0]["loss/pg"]) is float
    assert log.history() == rows


def test_jsonl_line_is_flushed_before_close(tmp_path):
    log = _logger(tmp_path)
    log.log(3, {"reward/mean": 1.0})
    # Read while the logger is still open: a killed run must keep what it logged.
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 3, "reward/mean": 1.0}]
    log.close()
    log.close()  # idempotent


def test_non_numeric_metric_raises(tmp_path):
    with _logger(tmp_path) as log, pytest.raises(TypeError, match="reward/mean"):
        log.log(1, {"reward/mean": "high"})


def test_tensorboard_event_holds_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(tmp_path, loggers=["tensorboard"], total_steps=5, show_progress=False)
    log.log(1, {"reward/mean": 0.25})
    log.log(2, {"reward/mean": np.float64(0.5)})
    log.close()
    tb_dir = tmp_path / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    assert "reward/mean" in acc.Tags()["scalars"]
    events = acc.Scalars("reward/mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.25), (2, 0.5)]
    assert not (tmp_path / "metrics.jsonl").exists()  # jsonl sink not selected


def test_resume_truncates_rows_past_step(tmp_path):
    with _logger(tmp_path) as log:
        for step in range(1, 6):
            log.log(step, {"reward/mean": float(step)})
    with _logger(tmp_path, resume_from_step=3) as log:
        assert log.history() == []
        log.log(4, {"reward/mean": 40.0})
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["reward/mean"] == 40.0


def test_fresh_run_starts_empty_file(tmp_path):
    with _logger(tmp_path) as log:
        log.log(1, {"reward/mean": 1.0})
    with _logger(tmp_path) as log:
        log.log(1, {"reward/mean": 2.0})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "reward/mean": 2.0}]


def test_read_jsonl_skips_torn_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a"')
    assert read_jsonl(path) == [{"step": 1, "a": 1.0}]


def test_progress_bar_ticks_per_step_and_shows_postfix(tmp_path):
    log = MetricsLogger(tmp_path, loggers=["console"], total_steps=4, show_progress=True)
    log.log(0, {"eval/success": 0.0})
    log.log(1, {"reward/mean": 0.123, "rollout/success": 0.5})
    log.log(2, {"reward/mean": 0.5})  # success keeps its last value
    log.log(2, {"eval/success": 1.0})  # eval shares the step: no extra tick
    assert log._bar.n == 2 and log._bar.total == 4
    assert "reward=0.50" in log._bar.postfix and "success=0.50" in log._bar.postfix
    log.close()
    assert log._bar is None
    no_bar = MetricsLogger(tmp_path, loggers=["jsonl"], total_steps=4, show_progress=True)
    assert no_bar._bar is None
    no_bar.close()


def test_plot_curves_writes_png(tmp_path):
    rows = [{"step": s, "reward/mean": s / 10, "rollout/success": s / 20} for s in range(1, 6)]
    rows[2]["eval/success"] = 0.4
    out = plot_curves(rows, tmp_path / "plots" / "curves.png")
    assert out == tmp_path / "plots" / "curves.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_plot_curves_none_without_known_keys(tmp_path):
    assert plot_curves([{"step": 1, "loss/pg": 0.1}], tmp_path / "c.png") is None
    assert plot_curves([], tmp_path / "c.png") is None
    assert not (tmp_path / "c.png").exists()


def test_write_summary_is_valid_json(tmp_path):
    summary = {"eval_success_after": 0.75, "steps": 20, "model": "tiny", "optimum": float("nan"),
               "wall": np.float32(1.5)}
    path = write_summary(tmp_path, summary)
    assert path == tmp_path / "summary.json"
    assert json.loads(path.read_text()) == {"eval_success_after": 0.75, "steps": 20, "model": "tiny",
                                            "optimum": None, "wall": 1.5}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left behind


def test_summary_table_formats_rows():
    text = summary_table({"eval_success_after": 0.5, "model": "tiny", "steps": 3})
    assert "eval_success_after" in text and "0.500" in text
    assert "tiny" in text and "\x1b[" not in text  # plain text, no ANSI codes


def test_unknown_logger_raises_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        MetricsLogger(tmp_path, loggers=["jsonl", "mlflow"], total_steps=1)
    msg = str(err.value)
    assert "mlflow" in msg and all(name in msg for name in ("console", "jsonl", "tensorboard", "wandb"))


def test_timer_accumulates_same_scope():
    timer = Timer()
    for _ in range(2):
        with timer.scope("collect"):
            time.sleep(0.02)
    with timer.scope("update"):
        pass
    out = timer.pop()
    assert set(out) == {"perf/time_collect", "perf/time_update"}
    assert out["perf/time_collect"] >= 0.04  # both sleeps count; no upper bound: machines are noisy
    assert timer.pop() == {}

