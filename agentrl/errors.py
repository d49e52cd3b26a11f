"""The project's error types: each message says what is wrong and how to fix it."""

from __future__ import annotations

import asyncio
import difflib
import reprlib
import threading
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
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


class ToolError(AgentRLError):
    """A tool call failed; the message is the tool's answer to the model (the run goes on)."""


class ToolTimeout(ToolError):
    """A tool call ran past its time limit and was stopped."""


class TrainingError(AgentRLError):
    """An update produced a non-finite loss or gradient; the message names the term and its inputs."""


class CollapseError(AgentRLError):
    """A collapse alarm stopped the run (trainer.on_collapse=stop); the folder is resumable."""


class UserExit(AgentRLError):
    """Env or agent code raised SystemExit, KeyboardInterrupt or another BaseException that is not an
    Exception. Carried as an ordinary exception so that it fails its episode: asyncio re-raises the
    first two out of its event loop, which would end the whole run with nothing said."""


def as_failure(e: BaseException) -> BaseException:
    """`e` as an episode may fail with it: a BaseException raised by user code becomes a UserExit
    (naming it); returned unchanged when it is an Exception already or must propagate: asyncio's
    own cancellation (a timeout, a stop), GeneratorExit, and a KeyboardInterrupt on the main
    thread, where a real Ctrl-C arrives."""
    if isinstance(e, Exception) or isinstance(e, GeneratorExit):
        return e
    if isinstance(e, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        return e
    if isinstance(e, asyncio.CancelledError) and _being_cancelled():
        return e
    failure = UserExit(f"{type(e).__name__}{f': {e}' if str(e) else ''}")
    failure.__cause__ = e
    return failure


async def contained(awaitable: Awaitable[T]) -> T:
    """Await user code (an agent's episode); a BaseException it raises becomes a UserExit, so that
    it fails the episode instead of leaving the event loop (see `as_failure`)."""
    try:
        return await awaitable
    except BaseException as e:
        failure = as_failure(e)
        if failure is e:
            raise
        raise failure from e


def must_propagate(e: BaseException) -> bool:
    """Whether `e` must go on up rather than fail an episode (see `as_failure`)."""
    return not isinstance(as_failure(e), Exception)


def _being_cancelled() -> bool:
    """Whether the running task was asked to stop (Python >= 3.11 can tell; before, assume so)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return True
    cancelling = getattr(task, "cancelling", None)
    return task is None or cancelling is None or cancelling() > 0
