"""The tool agent's work on one reply is bounded by `max_tool_calls`, however many calls the reply
holds: a reply of a thousand `<tool_call>` blocks runs `max_tool_calls` of them and answers the rest
once (one tool message, not one each), and locating the blocks among the reply's ids costs what
`max_tool_calls` + 1 blocks cost (it was a thousand blocks' decodes: 77 s, and 65k tokens of
answers on a 24k-token reply)."""

import asyncio
import json
import re

import pytest

from agentrl.agents.tool import ToolAgent
from agentrl.envs.math import MathEnv
from agentrl.envs.math_grader import shutdown_grader
from agentrl.llm.engine import SamplingParams
from agentrl.tools import tool
from agentrl.trajectory import Task
from helpers import ScriptedReplies, segments

RUNS: list[str] = []  # what the counted tool was called with, in this process


@pytest.fixture(scope="module", autouse=True)
def _stop_grader():
    yield
    shutdown_grader()


@tool(name="test_counted")
async def counted(text: str) -> str:
    """Say the text back, counting the calls.

    Args:
        text: What to say.
    """
    RUNS.append(text)
    return text


class CountingDecodes:
    """The tiny tokenizer, counting the decodes asked of it (everything else is the tokenizer's)."""

    def __init__(self, tokenizer):
        self._tokenizer, self.decodes = tokenizer, 0

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def decode(self, *args, **kwargs):
        self.decodes += 1
        return self._tokenizer.decode(*args, **kwargs)


def _call(text):
    return f'<tool_call>\n{json.dumps({"name": "test_counted", "arguments": {"text": text}})}\n</tool_call>'


def test_a_thousand_calls_in_one_reply_run_max_tool_calls_and_get_one_answer_for_the_rest(tiny_tokenizer):
    RUNS.clear()
    counting = CountingDecodes(tiny_tokenizer)
    reply = "".join(_call(f"c{k}") for k in range(1000))
    llm = ScriptedReplies(tiny_tokenizer, [reply, "<answer>1</answer>"])
    agent = ToolAgent(counting, SamplingParams(max_new_tokens=64), max_turns=1, tools=["test_counted"],
                      max_tool_calls=4)
    traj = asyncio.run(agent.run_episode(Task(env_seed=0, group_id=0, sampling_seed=1),
                                         MathEnv(min_operand=100, max_operand=999, ops="*"), llm))
    assert RUNS == ["c0", "c1", "c2", "c3"]  # the first max_tool_calls ran; the other 996 did not
    segs = segments(traj.loss_mask)
    assert [traj.token_ids[a:b] for a, b in segs] == llm.outputs  # the model's ids, verbatim
    between = tiny_tokenizer.decode(traj.token_ids[segs[0][1]:segs[1][0]])
    answers = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", between, re.S)
    assert answers == ["c0", "c1", "c2", "c3", "Error: no tool calls left in this episode (at most 4): these "
                       "996 calls were not run; answer without tools"]
    # what the answers added to the sequence is what 5 short answers take, not 1,000 answers' worth
    assert segs[1][0] - segs[0][1] == len(tiny_tokenizer.encode(between, add_special_tokens=False))
    assert segs[1][0] - segs[0][1] < 200 < len(llm.outputs[0])
    metrics = traj.info["metrics"]
    assert metrics["tools/calls"] == 1000 and metrics["tools/errors"] == 996 and metrics["tools/malformed"] == 0
    calls = [s for s in traj.info["tool_spans"] if s[2] == "call"]
    assert [s[3] for s in calls] == ["test_counted"] * 4 + ["not run"]
    assert calls[-1][1] == segs[0][1] - 1  # the calls not run: one span, from the fifth to the reply's EOS
    # Locating 5 blocks among the reply's ids: a bisection over its prefixes per block end, each
    # step one decode (a thousand blocks took 2 x 1,000 bisections).
    steps = len(llm.outputs[0]).bit_length() + 1
    assert counting.decodes <= 2 * 5 * steps, counting.decodes
