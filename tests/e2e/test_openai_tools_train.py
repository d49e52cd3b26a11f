"""End-to-end: an agent written against the `openai` client (examples/openai_tools.py) passes
`tools=`, gets the model's calls back as `tool_calls`, runs them with the run's sandboxed python
tool (`call_tool`: the tool agent's own code) and trains: the calls are counted in the tools/
metrics, the tool's answers sit in the trained sequences as ids of loss mask 0, and every reply
is the engine's sample."""

import re

import pytest

from agentrl.api import fit, load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.metrics import read_jsonl
from agentrl.tools import call_tool, offered_tools

from helpers import bwrap_problem, segments


def test_an_openai_client_agent_calls_the_runs_tools_and_trains(tmp_path):
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"bubblewrap cannot run here: {problem}")
    run = tmp_path / "run"
    # The warm start plays 8 batches of demonstrations (demo_pool; the config's 100 run the sandbox
    # 800 times) and trains its 100 steps on them in turn: enough to learn the call's form.
    cfg = load_config("configs/tool_python.yaml", [
        "agent.type=openai", "agent.args.entry=examples/openai_tools:run", "env.args.min_operand=2",
        "env.args.max_operand=9", "model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2",
        "model.tiny.intermediate_size=128", "model.tiny.vocab_size=400", "model.warm_start.max_steps=100",
        "model.warm_start.min_steps=100", "model.warm_start.batch_size=8", "model.warm_start.lr=3e-3",
        "model.warm_start.demo_pool=8",
        "rollout.temperature=0.3",
        "rollout.batch_size=8", "rollout.group_size=4", "rollout.max_new_tokens=96", "actor.ppo_mini_batch_size=8",
        "actor.micro_batch_size=4", "trainer.total_steps=2", "trainer.test_freq=2", "trainer.eval_episodes=4",
        "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]", "trainer.dump_trajectories_freq=1",
        "agent.args.tool_args.python.timeout=20", f"run_dir={run}", f"model.cache_dir={tmp_path / 'cache'}"])
    fit(cfg)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["env/products/tools/calls"] > 0 for r in rows), rows  # tool_calls came back and were run
    assert all(0.0 <= r["health/tool_use"] <= 1.0 for r in rows)  # the tool alarms watch this agent too
    answers, with_tool = [], 0
    for dump in (read_dump(path) for _, path in list_dumps(run)):
        pieces = dump["pieces"]
        for ep in dump["episodes"]:
            mask = [int(m) for m in ep["mask"]]
            text = "".join(pieces[str(i)] for i in ep["ids"])
            written = ["".join(pieces[str(i)] for i in ep["ids"][a:b])
                       for (_, a), (b, _) in zip(segments(mask), segments(mask)[1:])]  # ours, between replies
            found = [w for w in written if "<|im_start|>tool\n" in w]
            with_tool += bool(found) or "<|im_start|>tool\n" in text
            answers += [w.split("<|im_start|>tool\n")[1].split("<|im_end|>")[0] for w in found]
            gen = [k for k, m in enumerate(mask) if m]
            assert len(ep["lp"]) == len(ep["old"]) == len(gen)  # the replies: the engine's ids, scored as sampled
            assert all(abs(a - b) < 1e-3 for a, b in zip(ep["lp"], ep["old"]))
    assert with_tool > 0
    # the sandbox ran the model's code (`print(3 * 4)`): python's own output came back
    assert any(re.fullmatch(r"-?\d+\n", a) for a in answers), answers


def test_outside_an_episode_there_are_no_offered_tools_and_call_tool_says_so():
    assert offered_tools() == {}
    with pytest.raises(Exception, match="call_tool runs a call inside an episode of an agentrl run"):
        import asyncio

        asyncio.run(call_tool("python", {"code": "print(1)"}))
