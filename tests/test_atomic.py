"""Files written whole or not at all (agentrl/atomic.py), with the mode a reader expects."""

import os
import stat

import pytest

from agentrl.atomic import replacing, write_atomic
from agentrl.metrics import write_summary


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_write_replaces_the_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    write_atomic(target, "new \u00e9")
    assert target.read_text(encoding="utf-8") == "new \u00e9"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "weights.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with replacing(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["weights.safetensors"]


def test_a_secret_is_private_and_a_run_file_has_the_usual_mode(tmp_path):
    """The serve key: 0600. summary.json (and metrics.jsonl, dumps, view.html): the mode every
    other file of the run folder gets (config.yaml, samples.jsonl), not 0600 by accident."""
    secret = write_atomic(tmp_path / "serve-8000.key", "key", private=True)
    assert _mode(secret) == 0o600
    usual = tmp_path / "config.yaml"
    usual.write_text("x")
    assert _mode(write_summary(tmp_path, {"steps": 1})) == _mode(usual)
    assert _mode(write_atomic(tmp_path / "view.html", b"<html>")) == _mode(usual)
