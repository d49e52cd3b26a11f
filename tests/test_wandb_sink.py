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
