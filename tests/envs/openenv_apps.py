"""OpenEnv apps for tests/envs/test_openenv.py and tests/e2e/test_openenv_train.py, built with openenv-core.

The environment is the example's Grid Walk (examples/openenv_server.py: openenv-core's Environment,
Action and Observation, a typed action of two fields) with two test seeds: on seed 666 its `step`
raises (a server error), on seed 667 its `step` waits until the test releases it (a server that does
not answer). `ws_app` is openenv-core's app factory as a server is usually built (a WebSocket session
per episode); `http_app` serves one shared instance and has no `/ws` (a server without sessions).
`say_app` is a game any text plays (an action of one free text field, so even an untrained model's
replies reach the server and are paid by it): the end-to-end run trains on it. Also the render and
parse overrides the tests name as `module:function`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from agentrl.registry import import_file

example = import_file(Path(__file__).parents[2] / "examples" / "openenv_server.py")
FAIL_SEED, HANG_SEED = 666, 667
RELEASE = threading.Event()  # set by the tests to let a step waiting on HANG_SEED finish


class TestWalk(example.GridWalkEnvironment):
    """Grid Walk with a failing seed and a silent seed."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Any:
        self._seed = seed
        return super().reset(seed=seed, episode_id=episode_id, **kwargs)

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        if getattr(self, "_seed", None) == FAIL_SEED:
            raise RuntimeError("the walk broke down")
        if getattr(self, "_seed", None) == HANG_SEED:
            RELEASE.wait()
        return super().step(action, timeout_s=timeout_s, **kwargs)


ws_app = create_fastapi_app(TestWalk, example.WalkAction, example.WalkObservation, max_concurrent_envs=8)

SHARED = TestWalk()  # one state for every request: HTTP's /reset and /step play one episode
http_app = create_fastapi_app(lambda: SHARED, example.WalkAction, example.WalkObservation)
http_app.router.routes[:] = [r for r in http_app.router.routes if getattr(r, "path", "") != "/ws"]


class SayAction(Action):
    """Something to say."""

    text: str = Field(min_length=1, max_length=400, description="what to say")


class SayObservation(Observation):
    """The letter the server wants to hear."""

    letter: str = Field(description="the letter that pays")


class SayEnvironment(Environment[SayAction, SayObservation, State]):
    """Three turns to say the seed's letter: saying it pays 1 and ends the episode, anything else 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state, self._letter = State(), "a"

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> SayObservation:
        self._letter, self._state = "aeiou"[(seed or 0) % 5], State(episode_id=episode_id)
        return SayObservation(letter=self._letter, reward=0.0)

    def step(self, action: SayAction, timeout_s: float | None = None, **kwargs: Any) -> SayObservation:
        self._state.step_count += 1
        reward = 1.0 if self._letter in action.text else 0.0
        return SayObservation(letter=self._letter, reward=reward, done=self._state.step_count >= 3 or reward == 1.0)

    @property
    def state(self) -> State:
        return self._state


say_app = create_fastapi_app(SayEnvironment, SayAction, SayObservation, max_concurrent_envs=16)


def render_goal_first(observation: dict[str, Any]) -> str:
    """A render override: the goal, then the agent."""
    return f"goal {observation['goal_row']},{observation['goal_col']} you {observation['row']},{observation['col']}"


def parse_letters(reply: str) -> dict[str, Any] | None:
    """A parse override: `U1`, `R2`, ... (a letter of the direction and a count), else invalid."""
    names = {"U": "up", "D": "down", "L": "left", "R": "right"}
    text = reply.strip()
    if len(text) == 2 and text[0] in names and text[1] in "12":
        return {"direction": names[text[0]], "steps": int(text[1])}
    return None
