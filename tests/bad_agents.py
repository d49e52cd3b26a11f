"""Misbehaving agents (imported by the tests that run them through the collector and through a run).

`BadAgent(fault=...)` plays the chat agent's episode, then spoils what it returns in one way, or
leaves with what is not an Exception; on training episodes only (greedy evaluation ones are
left alone), and `stale_version` only once the engine serves version 1 or later (training step 2).
FAULTS maps each fault to words its error must contain.
"""

from __future__ import annotations

import dataclasses
import math
import sys

from agentrl.agents.chat import ChatAgent
from agentrl.registry import register_agent

FAULTS = {
    "oov_id": "outside the model's vocabulary",
    "negative_id": "returned token id -7 at position 0, outside the model's vocabulary",
    "float_id": "returned token id 3.0 (float); expected ints",
    "nan_logprob": "returned logprob nan for generated id",
    "inf_reward": "returned reward inf; expected a finite number",
    "stale_version": "returned policy version 0 for generated id",
    "future_version": "but the engine served version 0 while the episode ran",
    "missing_version": "returned policy version -1 for generated id",
    "misaligned": "logprobs for",
    "reward_past_end": "returned reward position",
    "wrong_group": "for the task of group",
    "string_success": "returned success='yes'; expected a bool",
    "wrong_object": "returned dict",
    "none": "returned NoneType None",
    "empty_list": "returned an empty list",
    "list_of_strings": "returned a list holding str",
    "sys_exit": "SystemExit: 4",
    "keyboard_interrupt": "KeyboardInterrupt",
    "generator_exit_like": "Leave: stop",
}


class Leave(BaseException):
    """A BaseException of the agent's own (as GeneratorExit or SystemExit are)."""


class BadAgent(ChatAgent):
    """The chat agent, returning its episode spoilt by `fault`."""

    def __init__(self, *args, fault: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fault = fault

    async def run_episode(self, task, env, llm):
        f = "" if task.greedy else self.fault
        if f == "sys_exit":
            sys.exit(4)
        if f == "keyboard_interrupt":
            raise KeyboardInterrupt
        if f == "generator_exit_like":
            raise Leave("stop")
        t = await super().run_episode(task, env, llm)
        gen = [i for i, m in enumerate(t.loss_mask) if m]
        if f == "oov_id":
            t.token_ids[gen[0]] = 10**6
        elif f == "negative_id":
            t.token_ids[0] = -7
        elif f == "float_id":
            t.token_ids[0] = 3.0
        elif f == "nan_logprob":
            t.logprobs[gen[0]] = math.nan
        elif f == "inf_reward":
            t.rewards[-1] = math.inf
        elif f == "stale_version" and t.versions[gen[0]] >= 1:
            t.versions[gen[0]] -= 1
        elif f == "future_version":
            t.versions[gen[0]] += 5
        elif f == "missing_version":
            t.versions[gen[0]] = -1
        elif f == "misaligned":
            t.logprobs.append(0.0)
        elif f == "reward_past_end":
            t.reward_positions[-1] = len(t.token_ids) + 3
        elif f == "wrong_group":
            t = dataclasses.replace(t, group_id=t.group_id + 1000)
        elif f == "string_success":
            t.success = "yes"
        elif f == "wrong_object":
            return {"token_ids": t.token_ids}
        elif f == "none":
            return None
        elif f == "empty_list":
            return []
        elif f == "list_of_strings":
            return ["an episode"]
        return t


register_agent("bad_agent", BadAgent, overwrite=True)
