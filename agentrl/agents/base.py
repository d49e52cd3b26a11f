"""The Agent contract: one async function per episode, with the env and engine passed in."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentrl.envs.base import Env
from agentrl.llm.engine import LLMClient
from agentrl.trajectory import Task, Trajectory


@runtime_checkable
class Agent(Protocol):
    """Runs one episode: decides what the model sees and how a reply becomes an action.

    The runtime builds a registered agent class as `cls(tokenizer=, sampling=, max_turns=,
    system_prompt=, budget=, **agent.args)` (`budget`: a `TokenBudget`, or None; every
    constructor takes it). A registered class with `collect_trajectory` and no `run_episode`
    of its own, or any subclass of the seeds' `agentrl.Agent` (agents/seed_api.py), is a
    seed-style agent and runs through `agents/compat.py` instead.
    """

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory | list[Trajectory]:
        """Play `task` in `env` with `llm`; return the token-exact trajectory (or one per segment,
        when the episode's history was rewritten: agents/openai.py)."""
        ...
