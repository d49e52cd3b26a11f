"""The Env contract: async, gym-like, text in and text out."""

from __future__ import annotations

import random
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Env(Protocol):
    """A text environment the agent talks to.

    `reset` returns the first observation and an info dict (with `optimal_success` where the
    env can compute it); `step` takes the model's raw reply and returns
    `(observation, reward, terminated, truncated, info)`. Any string is a valid argument to
    `step`: a reply that cannot be parsed is a normal step with a format penalty, never an
    exception. `info["success"]` is set on the step that ends the episode.

    Optional: `needs_tools = True` declares a task that cannot be solved without the tool agent's
    tools (the `reward_without_tools` collapse alarm watches it; agentrl/health.py), and
    `demonstration(rng, tools)` gives the warm start's replies of one step when the agent offers
    `tools` (tool calls, then the action: rollout/demos.py).

    A game declares `roles` (two or more names): its `reset` and every `step` that does not end it
    name the role that acts next in `info["role"]`, and return that role's observation (what is
    new for it); the step that ends it gives every role's reward in `info["rewards"]` (agents/game.py).
    """

    #: What the agent tells the model before the first observation (task and reply format).
    instructions: str

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start an episode; the same seed gives the same episode."""
        ...

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the model's reply."""
        ...

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed reply carrying a uniformly random valid action in the current state."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...
