"""The tool agent: the model's `<tool_call>` blocks run between env steps, their answers come back as
tool messages (mask 0) next to the model's ids verbatim (mask 1); malformed calls, failures and
timeouts are answered and counted; the calls per episode are bounded."""

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from agentrl.agents.tool import ToolAgent
from agentrl.envs.math import MathEnv
from agentrl.envs.math_grader import shutdown_grader
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.registry import TOOLS
from agentrl.tools import tool
from agentrl.trajectory import Task
from helpers import ScriptedReplies, bwrap_problem, segments

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module", autouse=True)
def _stop_grader():
    yield
    shutdown_grader()


@tool(name="test_echo")
async def echo(text: str) -> str:
    """Say the text back.

    Args:
        text: What to say.
    """
    if text == "slow":
        await asyncio.sleep(3600)
    if text == "fail":
        raise RuntimeError("it broke")
    return text


def _question(seed):
    env = MathEnv(min_operand=100, max_operand=999, ops="*")
    asyncio.run(env.reset(seed=seed))
    return env.question[len("What is "):-1], env.answer


def _call(name, **arguments):
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def _episode(agent, llm, seed=0):
    env = MathEnv(min_operand=100, max_operand=999, ops="*")
    return asyncio.run(agent.run_episode(Task(env_seed=seed, group_id=0, sampling_seed=1), env, llm))


def test_tool_answers_are_observations_and_the_model_ids_are_verbatim(tiny_tokenizer):
    expr, answer = _question(3)
    replies = [_call("test_echo", text=f"{expr} = {answer}"),
               '<tool_call>{"name": "tset_echo", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>'
               + _call("test_echo", words="x") + _call("test_echo", text="fail"),
               f"<answer>{answer}</answer>"]
    llm = ScriptedReplies(tiny_tokenizer, replies)
    agent = ToolAgent(tiny_tokenizer, SamplingParams(max_new_tokens=96), max_turns=1, tools=["test_echo"],
                      max_tool_calls=8)
    traj = _episode(agent, llm, seed=3)
    assert traj.success and traj.rewards == [0.0, 0.0, 1.0] and traj.truncation_reason is None
    segs = segments(traj.loss_mask)
    assert [traj.token_ids[a:b] for a, b in segs] == llm.outputs  # the engine's ids, verbatim, mask 1
    assert traj.reward_positions == [b - 1 for _, b in segs]
    for (start, _), prompt in zip(segs, llm.prompts):
        assert traj.token_ids[:start] == prompt  # each prompt was exactly the sequence so far
    # between replies: the tool answers, as the chat template renders tool messages, mask 0
    between = tiny_tokenizer.decode(traj.token_ids[segs[0][1]:segs[1][0]])
    assert between == f"\n<|im_start|>tool\n{expr} = {answer}<|im_end|>\n<|im_start|>assistant\n"
    answers = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>",
                         tiny_tokenizer.decode(traj.token_ids[segs[1][1]:segs[2][0]]), re.S)
    assert answers == ["Error: unknown tool 'tset_echo'. Did you mean 'test_echo'? The tools: test_echo",
                       "Error: the tool call is not valid JSON (Expecting property name enclosed in double quotes: "
                       "line 1 column 2 (char 1))",
                       "Error: test_echo has no argument 'words'; its arguments: text",
                       "Error: RuntimeError: it broke"]
    # the whole sequence is the template's rendering of the conversation, with the tool rendered
    text = tiny_tokenizer.decode(traj.token_ids)
    assert text.startswith("<|im_start|>system\n# Tools\n") and '"name": "test_echo"' in text
    assert traj.info["metrics"] == {"grader_timeout": 0.0, "tools/calls": 5.0, "tools/malformed": 3.0,
                                    "tools/errors": 1.0, "tools/timeouts": 0.0, "tools/used": 1.0,
                                    "tools/success_with_tool": 1.0}
    assert len(traj.turn_states) == 3 and traj.turn_states[1].endswith(f"{expr} = {answer}")


def test_calls_are_bounded_timed_out_and_truncated(tiny_tokenizer):
    llm = ScriptedReplies(tiny_tokenizer, [_call("test_echo", text="slow") + _call("test_echo", text="x" * 50)
                                           + _call("test_echo", text="refused"),
                                           _call("test_echo", text="no calls left: this reply is the action")])
    agent = ToolAgent(tiny_tokenizer, SamplingParams(max_new_tokens=96), max_turns=1, tools=["test_echo"],
                      max_tool_calls=2, tool_timeout=0.05, max_tool_response_length=20)
    traj = _episode(agent, llm)
    answers = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", tiny_tokenizer.decode(traj.token_ids), re.S)
    assert answers == ["Error: test_echo did...(truncated)", "x" * 20 + "...(truncated)",
                       "Error: no tool calls...(truncated)"]
    assert not traj.success and traj.invalid_actions == 1 and traj.num_turns == 2  # the second call went to the env
    assert traj.info["metrics"]["tools/calls"] == 3 and traj.info["metrics"]["tools/timeouts"] == 1
    assert traj.info["metrics"]["tools/errors"] == 2 and traj.info["metrics"]["tools/success_with_tool"] == 0.0
    text = "".join(map(str, range(30)))  # verl's other sides: keep the end, or both ends
    for side, kept in (("right", "(truncated)..." + text[-20:]), ("middle", text[:10] + "...(truncated)..." + text[-10:])):
        cut = ToolAgent(tiny_tokenizer, SamplingParams(), max_turns=1, max_tool_response_length=20,
                        tool_response_truncate_side=side)
        assert cut._truncate(text) == kept


def test_without_tools_it_is_the_chat_agent(tiny_tokenizer):
    from agentrl.agents.chat import ChatAgent

    _, answer = _question(5)
    replies = [_call("test_echo", text="hi")]
    chat = _episode(ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=64), max_turns=1),
                    ScriptedReplies(tiny_tokenizer, replies), seed=5)
    off = _episode(ToolAgent(tiny_tokenizer, SamplingParams(max_new_tokens=64), max_turns=1, tools=[]),
                   ScriptedReplies(tiny_tokenizer, replies), seed=5)
    assert off.token_ids == chat.token_ids and off.rewards == chat.rewards and off.invalid_actions == 1
    assert off.info["metrics"]["tools/calls"] == 0 and off.info["metrics"]["tools/success_without_tool"] == 0.0


def test_64_episodes_run_python_at_once_without_a_hang_or_a_leaked_process(tiny_tokenizer):
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"bubblewrap cannot run here: {problem}")

    class Calculator:
        """Asks python for the product, then answers with what python printed."""

        async def generate(self, prompt_ids, sampling):
            text = tiny_tokenizer.decode(prompt_ids)
            printed = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text, re.S)
            if printed:
                reply = f"<answer>{printed[-1].strip()}</answer>"
            else:
                expr = re.findall(r"What is (.*?)\?", text)[-1]
                reply = _call("python", code=f"print({expr})")
            ids = tiny_tokenizer.encode(reply, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
            return Completion(ids, [0.0] * len(ids), "stop")

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    agent = ToolAgent(tiny_tokenizer, SamplingParams(max_new_tokens=96), max_turns=1, tools=["python"],
                      tool_args={"python": {"timeout": 600.0}}, tool_timeout=600.0)

    async def play_all():
        return await asyncio.gather(*(agent.run_episode(Task(env_seed=s, group_id=s, sampling_seed=s),
                                                        MathEnv(min_operand=100, max_operand=999, ops="*"),
                                                        Calculator()) for s in range(64)))

    trajs = asyncio.run(play_all())
    assert [t.success for t in trajs] == [True] * 64  # every python call answered, right
    assert all(t.info["metrics"]["tools/calls"] == 1 and t.info["metrics"]["tools/errors"] == 0 for t in trajs)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.parametrize("args, expected", [
    (["agent.args.tools=[pyton]"], "agent.args.tools=['pyton'] is rejected by agent type 'tool': unknown tool "
                                   "'pyton' in tools. Did you mean 'python'? Known: python"),
    (["agent.args.tools=[python]", "agent.args.tool_args.python.sandboxx=process"],
     "tool_args.python.sandboxx is not a setting of tool 'python'. Did you mean 'sandbox'?"),
    (["agent.args.tools=[python]", "agent.args.tool_args.python.sandbox=docker"],
     "tool_args.python.sandbox='docker': expected one of bwrap, process"),
    (["agent.args.tools=[python]", "agent.args.tool_response_truncate_side=top"],
     "tool_response_truncate_side='top'; expected one of left, right, middle"),
    (["agent.args.tools=[python]", "agent.args.needs_tools=sometimes"],
     "needs_tools='sometimes'; expected true, false or null"),
])
def test_bad_tool_settings_fail_the_plan_in_one_line(args, expected, capfd, monkeypatch):
    # The CLI's own entry point, in this process (a process per case paid seconds of imports each;
    # the next test runs the CLI in a process of its own): exit status 2 and one line on stderr,
    # read at the file descriptor (capfd), so a warning any library prints would show up too.
    from agentrl.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what `main` would set, undone after the test
    monkeypatch.chdir(ROOT)
    assert main(["plan", "env.type=math", "agent.type=tool", *args]) == 2
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], err[-2000:]


def test_a_tool_of_yours_is_one_decorated_function_in_a_file(tmp_path):
    (tmp_path / "my_tools.py").write_text(
        "from agentrl.tools import tool\n\n\n@tool\ndef lookup(word: str) -> str:\n"
        '    """Look a word up.\n\n    Args:\n        word: The word.\n    """\n    return word.upper()\n')
    res = subprocess.run([sys.executable, "-m", "agentrl.cli", "plan", f"imports=[{tmp_path / 'my_tools.py'}]",
                          "env.type=math", "agent.type=tool", "agent.args.tools=[lookup]"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "lookup" in res.stdout
    assert "lookup" not in TOOLS  # registered in that run's process, not here
