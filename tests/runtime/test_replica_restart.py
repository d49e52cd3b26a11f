"""Waiting on an engine replica that Ray restarts: one rule for every wait (the env managers'
clients, the HTTP clients, trainer rank 0 on vLLM replicas: runtime/ray/engine_client.py)."""

import asyncio
import time

import pytest

ray = pytest.importorskip("ray")

from agentrl.errors import EngineError  # noqa: E402
from agentrl.runtime.ray.engine_client import call_when_up, check_restarting  # noqa: E402


def test_a_replica_that_died_for_good_is_named_at_once():
    with pytest.raises(EngineError, match="engine-1 died and will not restart"):
        check_restarting(ray.exceptions.ActorDiedError(), "engine-1", 30.0, time.monotonic() + 30)


def test_a_restarting_replica_is_waited_for_until_its_deadline_then_named():
    check_restarting(ray.exceptions.RayActorError(), "engine-1", 30.0, time.monotonic() + 30)  # wait on
    with pytest.raises(EngineError, match=r"engine-1 did not come back within runtime\.restart_timeout=30\.0s"):
        check_restarting(ray.exceptions.RayActorError(), "engine-1", 30.0, time.monotonic() - 1)


def test_a_call_is_retried_while_the_replica_restarts_and_fails_once_it_died_for_good():
    answers: list = [ray.exceptions.RayActorError(), ray.exceptions.RayActorError(), "up",
                     ray.exceptions.ActorDiedError()]

    async def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert asyncio.run(call_when_up(call, "engine-0", 60.0)) == "up" and len(answers) == 1
    with pytest.raises(EngineError, match="engine-0 died and will not restart"):
        asyncio.run(call_when_up(call, "engine-0", 60.0))
