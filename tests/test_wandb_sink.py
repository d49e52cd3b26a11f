"""The W&B sink (agentrl/wandb_sink.py) without wandb installed: one line, before any model."""

import importlib.util

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError


def test_wandb_logger_without_wandb_installed_says_which_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError) as e:
        load_config(None, ["trainer.logger=[jsonl,wandb]"])
    assert "install the extra wandb" in str(e.value) and "\n" not in str(e.value)
    load_config(None, ["trainer.logger=[jsonl]"])  # without wandb in the loggers nothing asks for it


def test_a_finished_wandb_run_leaves_the_processs_exit_hooks_as_they_were(tmp_path, monkeypatch):
    # wandb.init replaces sys.exit and sys.excepthook; a run inside a user's process
    # (agentrl.api.fit) must give them back, or the user's later sys.exit goes through wandb.
    pytest.importorskip("wandb")
    import sys

    from agentrl.wandb_sink import WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    before = (sys.exit, sys.excepthook)
    sink = WandbSink(tmp_path / "run", "hooks", {"seed": 0})
    sink.log({"step": 1, "reward/mean": 0.5})
    sink.close()
    assert (sys.exit, sys.excepthook) == before
