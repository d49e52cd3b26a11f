"""The project's error types: each message says what is wrong and how to fix it."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from typing import Any

SHOWN_MAX = 200  # characters of a value an error line quotes

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = SHOWN_MAX
_REPR.maxlong = 60
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 8, 8, 8, 8


class AgentRLError(Exception):
    """Base of every error agentrl raises on purpose (the CLI prints these as one line)."""


class ConfigError(AgentRLError):
    """A config file, key or value is invalid."""


class RegistryError(AgentRLError, KeyError):
    """An unknown or clashing name in a registry."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class EnvError(AgentRLError):
    """An environment was built or used against its contract."""


class EngineError(AgentRLError):
    """The inference engine could not serve a request."""


class RolloutError(AgentRLError):
    """Too many episodes of a step failed to train on (a broken env or agent, not bad luck)."""


class CheckpointError(AgentRLError):
    """A checkpoint is missing, incomplete or incompatible."""


def shown(value: Any) -> str:
    """repr(value) for an error line: at most about SHOWN_MAX characters, built without expanding
    what is cut (a value from a config may be a 10 MB string or a deeply shared structure)."""
    text = _REPR.repr(value)
    return text if len(text) <= SHOWN_MAX + 20 else text[:SHOWN_MAX] + "..."


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean 'x'?' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


class TrainingError(AgentRLError):
    """An update produced a non-finite loss or gradient; the message names the term and its inputs."""


class CollapseError(AgentRLError):
    """A collapse alarm stopped the run (trainer.on_collapse=stop); the folder is resumable."""
