"""The Agent contract: one async function per episode, with the env and engine passed in."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentrl.envs.base import Env
from agentrl.llm.engine import LLMClient
from agentrl.rollout.trajectory import Task, Trajectory


@runtime_checkable
class Agent(Protocol):
    """Runs one episode: decides what the model sees and how a reply becomes an action."""

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory:
        """Play `task` in `env` with `llm`; return the token-exact trajectory."""
        ...
