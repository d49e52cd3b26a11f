"""End-to-end: a short real training run of an arithmetic env with the tool agent and the python
tool (bubblewrap): the tool metrics and health signals are logged, the trained batch holds the
tool answers as ids of loss mask 0 between the model's replies, which are the engine's ids as
sampled, and the run's page shows the calls and answers in its token view (headless Chromium)."""

import random
import re
from pathlib import Path

import pytest

from agentrl.api import fit, load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.metrics import read_jsonl
from agentrl.viewer import write_page

import browser  # tests/ is on sys.path (conftest.py)
from helpers import bwrap_problem, segments


# The warm start's one demonstration: a fixed call, learnt in a few steps (this run checks the
# plumbing, not learning). With max_tool_calls=1 the first such reply runs the tool; the second,
# with no calls left, is the answer the env grades. The warm start plays 4 batches (demo_pool)
# and trains its 100 steps on them in turn: every demonstration is the same text, so more batches
# would only run the sandbox more often (800 times instead of 32). (At 50 steps no sampled reply
# was the demonstration verbatim.)
DEMONSTRATION = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call><answer>42</answer>'


class ProductEnv:
    """What is A * B? (three-digit factors), answered as <answer>N</answer>; one step per episode."""

    instructions = "Compute the product with the python tool, then answer as <answer>N</answer>."
    needs_tools = True  # the reward_without_tools alarm watches it

    async def reset(self, seed=None, options=None):
        rng = random.Random(seed)
        self.a, self.b = rng.randint(100, 999), rng.randint(100, 999)
        return f"What is {self.a} * {self.b}?", {}

    async def step(self, action):
        found = re.findall(r"<answer>\s*(-?\d+)\s*</answer>", action)
        ok = bool(found) and int(found[-1]) == self.a * self.b
        return ("Correct." if ok else "Wrong."), float(ok), True, False, {"success": ok, "action_valid": bool(found)}

    def sample_action(self, rng):
        return DEMONSTRATION

    def close(self):
        pass


@pytest.fixture(scope="module")
def products_run(tmp_path_factory):
    """The run folder of 2 training steps, dumped at each."""
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"bubblewrap cannot run here: {problem}")
    tmp_path = tmp_path_factory.mktemp("products")
    run = tmp_path / "run"
    cfg = load_config({"exp_name": "products", "env": {"max_turns": 1}}, [
        "model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.vocab_size=400", "model.warm_start.max_steps=100", "model.warm_start.min_steps=100",
        "model.warm_start.batch_size=8", "model.warm_start.demo_pool=4", "rollout.temperature=0.3",
        "rollout.batch_size=8", "rollout.group_size=4", "rollout.max_new_tokens=64",
        "actor.ppo_mini_batch_size=8", "actor.micro_batch_size=4", "trainer.total_steps=2", "trainer.test_freq=2",
        "trainer.eval_episodes=4", "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]",
        "trainer.dump_trajectories_freq=1", "agent.type=tool", "agent.args.tools=[python]",
        "agent.args.max_tool_calls=1", f"run_dir={run}", f"model.cache_dir={tmp_path / 'cache'}"])
    fit(cfg, env_cls=ProductEnv)
    return run


def test_a_tool_agent_trains_with_the_python_tool(products_run):
    run = products_run
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for name in ("calls", "malformed", "errors", "timeouts", "used"):
        assert all(f"env/ProductEnv/tools/{name}" in r for r in rows), name
    assert rows[0]["env/ProductEnv/tools/calls"] > 0
    assert any(k.startswith("env/ProductEnv/tools/success_with") for r in rows for k in r)
    assert any(k.startswith("eval/ProductEnv/tools/") for k in read_jsonl(run / "metrics.jsonl")[-1])
    # the tool alarms' signals, every step: the share of malformed calls, tool use and reward on a
    # task that needs tools (ProductEnv.needs_tools)
    for r in rows:
        assert 0.0 <= r["health/malformed_calls"] <= 1.0
        assert r["health/tool_use"] == pytest.approx(r["env/ProductEnv/tools/used"])
        assert r["health/tool_task_reward"] == pytest.approx(r["reward/mean"])

    dumps = [read_dump(path) for _, path in list_dumps(run)]
    assert len(dumps) == 2
    with_tool = ran = 0
    for ep, pieces in [(ep, dump["pieces"]) for dump in dumps for ep in dump["episodes"]]:
        mask = [int(m) for m in ep["mask"]]
        spans = segments(mask)
        between = ["".join(pieces[str(i)] for i in ep["ids"][a:b])
                   for (_, a), (b, _) in zip(spans, spans[1:])]  # what we wrote between two replies
        if between and between[0].startswith("\n<|im_start|>tool\n"):
            with_tool += 1
            answer = between[0][len("\n<|im_start|>tool\n"):].split("<|im_end|>")[0]
            reply = "".join(pieces[str(i)] for i in ep["ids"][spans[0][0]:spans[0][1]])
            if reply.startswith(DEMONSTRATION):  # the call as demonstrated: python's own answer
                assert answer == "42\n"
                ran += 1
        # the replies are the engine's samples: the trainer scores each id as the engine did
        gen = [k for k, m in enumerate(mask) if m]
        assert len(ep["lp"]) == len(ep["old"]) == len(gen)
        assert all(abs(a - b) < 1e-3 for a, b in zip(ep["lp"], ep["old"]))
    assert with_tool > 0 and ran > 0


def test_the_page_shows_the_tool_calls_and_their_answers(products_run, tmp_path):
    page = write_page(products_run)
    step, path = list_dumps(products_run)[-1]
    dump = read_dump(path)
    k, ep = next((k, ep) for k, ep in enumerate(dump["episodes"]) if any(s[2] == "call" for s in ep.get("tools", [])))
    for a, b, kind, name in ep["tools"]:  # each span is what its kind says
        text = "".join(dump["pieces"][str(i)] for i in ep["ids"][a:b])
        assert set(ep["mask"][a:b]) == ({"1"} if kind == "call" else {"0"})
        assert "<tool_call>" in text if kind == "call" else text.startswith("<|im_start|>tool\n")
        assert name and (kind == "answer" or text.count("<tool_call>") == 1)  # one block per call
    if browser.missing() is not None:
        pytest.skip(str(browser.missing()))
    b = browser.Browser()
    try:
        b.open(Path(page).as_uri())
        assert b.wait("return document.querySelectorAll('#episode .tok').length > 0")
        b.click(f'#step-select option[value="{step}"]')
        b.click(f'#group-select option[value="{ep["group"]}"]')
        b.click(f'#episode-select option[value="{k}"]')
        dom = b.js("""const q = (s) => [...document.querySelectorAll(s)];
            return {calls: q('#episode .tool-call').map(e => [e.dataset.tool, e.querySelectorAll('.tok').length,
                                                              e.querySelector('.tool-label').textContent]),
                    answers: q('#episode .tool-answer').map(e => [e.dataset.tool, e.querySelectorAll('.tok').length,
                                                                  e.querySelector('.tool-label').textContent]),
                    legend: document.querySelector('#legend').textContent,
                    head: document.querySelector('#episode-head').textContent}""")
        spans = {"call": [], "answer": []}
        for a, b_, kind, name in ep["tools"]:
            spans[kind].append([name, b_ - a, ("tool call · " if kind == "call" else "tool answer · ") + name])
        assert dom["calls"] == spans["call"] and dom["answers"] == spans["answer"] and dom["calls"]
        assert "tool call" in dom["legend"] and f"tool calls {len(spans['call'])}" in dom["head"]
        tip = b.js("""const t = document.querySelector('#episode .tool-call .tok'); const r = t.getBoundingClientRect();
            t.dispatchEvent(new MouseEvent('mouseover', {bubbles: true, clientX: r.left + 1, clientY: r.top + 1}));
            return document.querySelector('#tip').textContent""")
        assert f"tool call · {spans['call'][0][0]}" in tip
        assert b.screenshot(tmp_path / "tools.png").stat().st_size > 10_000
    finally:
        b.close()
