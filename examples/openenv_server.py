"""A small OpenEnv environment server, built only with `openenv-core` (no agentrl import).

Grid Walk: the agent stands on a 3x3 grid and walks to a goal cell, both drawn from the reset's
seed. An action has two fields, `direction` (up, down, left, right) and `steps` (1 or 2); the
server pays -0.1 a move, +1 on reaching the goal (which ends the episode) and ends it with 0
after six moves. Serve it, then train against it:

    python examples/openenv_server.py 8011
    agentrl train env.type=openenv env.args.url=http://127.0.0.1:8011

or let the run serve it on loopback for its own life:

    agentrl train env.type=openenv env.args.app=examples/openenv_server:app
"""

from __future__ import annotations

import random
import sys
from typing import Any, Literal

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

SIZE = 3
MAX_MOVES = 6
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class WalkAction(Action):
    """Where to walk, and how far."""

    direction: Literal["up", "down", "left", "right"] = Field(description="the direction to walk")
    steps: int = Field(ge=1, le=2, description="how many cells to walk (a wall stops the walk)")


class WalkObservation(Observation):
    """Where the agent and the goal are."""

    row: int = Field(description="the agent's row, 0 at the top")
    col: int = Field(description="the agent's column, 0 at the left")
    goal_row: int = Field(description="the goal's row")
    goal_col: int = Field(description="the goal's column")
    message: str = Field(default="", description="what the last move did")


class GridWalkEnvironment(Environment[WalkAction, WalkObservation, State]):
    """The 3x3 walk: each session owns one of these (no state is shared between sessions)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self._pos, self._goal = (0, 0), (0, 0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> WalkObservation:
        """A new start and goal, drawn from `seed`."""
        rng = random.Random(seed)
        cells = [(r, c) for r in range(SIZE) for c in range(SIZE)]
        self._pos, self._goal = rng.sample(cells, 2)
        self._state = State(episode_id=episode_id, step_count=0)
        return self._observe("Walk to the goal.", 0.0, False)

    def step(self, action: WalkAction, timeout_s: float | None = None, **kwargs: Any) -> WalkObservation:
        """Walk; the goal pays 1 and ends the episode, every other move costs 0.1."""
        dr, dc = MOVES[action.direction]
        r, c = self._pos
        for _ in range(action.steps):
            if 0 <= r + dr < SIZE and 0 <= c + dc < SIZE:
                r, c = r + dr, c + dc
        self._pos = (r, c)
        self._state.step_count += 1
        if self._pos == self._goal:
            return self._observe("You reached the goal.", 1.0, True)
        if self._state.step_count >= MAX_MOVES:
            return self._observe("Out of moves.", 0.0, True)
        return self._observe(f"You walked {action.direction}.", -0.1, False)

    def _observe(self, message: str, reward: float, done: bool) -> WalkObservation:
        return WalkObservation(row=self._pos[0], col=self._pos[1], goal_row=self._goal[0], goal_col=self._goal[1],
                               message=message, reward=reward, done=done)

    @property
    def state(self) -> State:
        """The episode's id and move count."""
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        """The name and description clients show."""
        return EnvironmentMetadata(name="grid_walk", description="Walk to the goal on a 3x3 grid.")


# openenv-core's own app factory: /reset, /step, /state, /schema, /metadata, /health and /ws sessions.
app = create_fastapi_app(GridWalkEnvironment, WalkAction, WalkObservation, max_concurrent_envs=64)


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 8011)
