"""The viewer page (agentrl/viewer.py) without a browser: what it inlines, how it stays light for
long runs, escaping, the loopback server's routes, and one-line errors. The page in a real
browser is tests/e2e/test_observe.py."""

import asyncio
import json
import re
import threading

import httpx
import pytest

from agentrl.agents.tool import ToolAgent
from agentrl.dumps import TrajectoryDumper
from agentrl.envs.math import MathEnv
from agentrl.envs.math_grader import shutdown_grader
from agentrl.errors import AgentRLError
from agentrl.llm.engine import SamplingParams
from agentrl.tools import tool
from agentrl.train.batch import pack
from agentrl.trajectory import Task, Trajectory
from agentrl.viewer import build_page, curves, make_server, pick_steps, write_page
from helpers import ScriptedReplies


def blocks(html):
    """{id: parsed JSON} of the page's data blocks."""
    found = re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', html, flags=re.S)
    return {name: json.loads(text) for name, text in found}


@pytest.fixture
def run(tmp_path, tiny_tokenizer):
    """A run folder with metrics for 30 steps and a dump every 3 steps."""
    (tmp_path / "config.yaml").write_text("exp_name: lake\n")
    rows = [{"step": s, "reward/mean": s / 30, "health/reply_repeat": 0.2, "health/alarms": float(s == 7)}
            for s in range(1, 31)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reply = tiny_tokenizer.encode("</script><b>Left</b>")  # a reply that would end a naive data block
    trajs = [Trajectory([1, 2, *reply], [0, 0] + [1] * len(reply), [0.0, 0.0] + [-0.5] * len(reply),
                        [-1, -1] + [0] * len(reply), [1.0], [len(reply) + 1], 0, 0) for _ in range(2)]
    batch = pack(trajs, 0)
    batch.old_logprobs, batch.advantages, batch.returns = batch.behaviour_logprobs, batch.loss_mask, batch.loss_mask
    dumper = TrajectoryDumper(tmp_path, tiny_tokenizer, 1000)
    for step in range(3, 31, 3):
        dumper.write(step, trajs, batch, 0, "grpo")
    return tmp_path


def test_pick_steps_spreads_the_inlined_steps_over_the_run():
    assert pick_steps([1, 2, 3], 5) == [1, 2, 3]
    assert pick_steps(list(range(10, 110, 10)), 4) == [10, 40, 70, 100]  # first and last included
    assert pick_steps([5, 6, 7], 1) == [7]


def test_the_page_inlines_a_capped_number_of_steps_and_lists_the_rest(run):
    html = build_page(run, max_steps=4)
    data = blocks(html)
    index = data["agentrl-index"]
    assert index["run"]["name"] == "lake" and [s["step"] for s in index["steps"]] == list(range(3, 31, 3))
    inlined = [s["step"] for s in index["steps"] if s["inlined"]]
    assert inlined == [3, 12, 21, 30] and index["inlined"] == 4
    assert sorted(k for k in data if k.startswith("agentrl-step-")) == sorted(f"agentrl-step-{s}" for s in inlined)
    assert index["alarm_steps"] == [7] and index["curves"]["reward/mean"][-1] == [30, 1.0]
    # a decoded piece cannot end its block early: every "<" inside the JSON is escaped
    assert "</script><b>" not in html
    dump = data["agentrl-step-3"]
    ep = dump["episodes"][0]
    assert "".join(dump["pieces"][str(i)] for i in ep["ids"][2:]) == "</script><b>Left</b>"
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)


def test_curves_are_thinned_but_keep_the_last_point():
    rows = [{"step": s, "reward/mean": float(s)} for s in range(1, 5001)]
    points, _ = curves(rows)
    assert len(points["reward/mean"]) <= 2001 and points["reward/mean"][-1] == [5000, 5000.0]


def test_write_page_and_the_loopback_server(run):
    page = write_page(run)
    assert page == run / "view.html" and "agentrl-index" in page.read_text()
    server = make_server(run, page, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert server.server_address[0] == "127.0.0.1"
        assert httpx.get(base + "/").text == page.read_text()
        step = httpx.get(base + "/dumps/6.json")
        assert step.status_code == 200 and step.json()["step"] == 6
        assert httpx.get(base + "/dumps/5.json").status_code == 404
        assert httpx.get(base + "/dumps/../config.yaml").status_code == 404
        assert httpx.get(base + "/nothing").status_code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_a_folder_that_is_no_run_is_one_line(tmp_path):
    with pytest.raises(AgentRLError) as e:
        build_page(tmp_path / "nowhere")
    assert "is not a run folder" in str(e.value) and "\n" not in str(e.value)


@tool(name="test_upper")
def upper(text: str) -> str:
    """Say the text in capitals.

    Args:
        text: What to say.
    """
    return text.upper()


def tool_run(folder, tokenizer):
    """A run folder whose one dump holds a tool agent's episode: a call, a malformed call, their
    answers, then the answer the env grades."""
    (folder / "config.yaml").write_text("exp_name: tools\n")
    replies = ['Let me ask.<tool_call>\n{"name": "test_upper", "arguments": {"text": "abc"}}\n</tool_call>'
               "<tool_call>{oops}</tool_call>", "<answer>0</answer>"]
    agent = ToolAgent(tokenizer, SamplingParams(max_new_tokens=96), max_turns=1, tools=["test_upper"])
    traj = asyncio.run(agent.run_episode(Task(env_seed=1, group_id=0, sampling_seed=1),
                                         MathEnv(min_operand=100, max_operand=999, ops="*"),
                                         ScriptedReplies(tokenizer, replies)))
    shutdown_grader()
    batch = pack([traj], 0)
    batch.old_logprobs, batch.advantages, batch.returns = batch.behaviour_logprobs, batch.loss_mask, batch.loss_mask
    TrajectoryDumper(folder, tokenizer, 10_000).write(1, [traj], batch, 0, "grpo")
    return folder


def test_the_page_marks_tool_calls_and_their_answers_with_the_tool_name(tmp_path, tiny_tokenizer):
    run = tool_run(tmp_path, tiny_tokenizer)
    dump = blocks(build_page(run))["agentrl-step-1"]
    ep = dump["episodes"][0]
    text = {(kind, name): "".join(dump["pieces"][str(i)] for i in ep["ids"][a:b]) for a, b, kind, name in ep["tools"]}
    assert list(text) == [("call", "test_upper"), ("call", "malformed"), ("answer", "test_upper, malformed")]
    assert text["call", "test_upper"].strip() == '<tool_call>\n{"name": "test_upper", "arguments": {"text": "abc"}}\n</tool_call>'
    assert text["call", "malformed"] == "<tool_call>{oops}</tool_call>"
    # the answers: the template's tool messages, ids we wrote (mask 0); the calls: the model's ids (mask 1)
    answers = text["answer", "test_upper, malformed"]
    assert answers.startswith("<|im_start|>tool\nABC<|im_end|>") and "Error: the tool call is not valid JSON" in answers
    for a, b, kind, _ in ep["tools"]:
        assert set(ep["mask"][a:b]) == ({"1"} if kind == "call" else {"0"})
    # the served step holds the same
    page = write_page(run)
    server = make_server(run, page, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        served = httpx.get(f"http://127.0.0.1:{server.server_address[1]}/dumps/1.json").json()
        assert served["episodes"][0]["tools"] == ep["tools"]
    finally:
        server.shutdown()
        server.server_close()
