"""End-to-end: a short real training run of an arithmetic env with the tool agent and the python
tool (bubblewrap): the tool metrics are logged, and the trained batch holds the tool answers as
ids of loss mask 0 between the model's replies, which are the engine's ids as sampled."""

import random
import re

import pytest

from agentrl.api import fit, load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.metrics import read_jsonl
from helpers import bwrap_problem, segments


# The warm start's one demonstration: a fixed call, learnt in a few steps (this run checks the
# plumbing, not learning). With max_tool_calls=1 the first such reply runs the tool; the second,
# with no calls left, is the answer the env grades.
DEMONSTRATION = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call><answer>42</answer>'


class ProductEnv:
    """What is A * B? (three-digit factors), answered as <answer>N</answer>; one step per episode."""

    instructions = "Compute the product with the python tool, then answer as <answer>N</answer>."

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


def test_a_tool_agent_trains_with_the_python_tool(tmp_path):
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"bubblewrap cannot run here: {problem}")
    run = tmp_path / "run"
    cfg = load_config({"exp_name": "products", "env": {"max_turns": 1}}, [
        "model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.vocab_size=400", "model.warm_start.max_steps=100", "model.warm_start.min_steps=100",
        "model.warm_start.batch_size=8", "rollout.temperature=0.3", "rollout.batch_size=8", "rollout.group_size=4", "rollout.max_new_tokens=64",
        "actor.ppo_mini_batch_size=8", "actor.micro_batch_size=4", "trainer.total_steps=2", "trainer.test_freq=2",
        "trainer.eval_episodes=4", "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]",
        "trainer.dump_trajectories_freq=1", "agent.type=tool", "agent.args.tools=[python]",
        "agent.args.max_tool_calls=1", f"run_dir={run}", f"model.cache_dir={tmp_path / 'cache'}"])
    fit(cfg, env_cls=ProductEnv)

    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for name in ("calls", "malformed", "errors", "timeouts", "used"):
        assert all(f"env/ProductEnv/tools/{name}" in r for r in rows), name
    assert rows[0]["env/ProductEnv/tools/calls"] > 0
    assert any(k.startswith("env/ProductEnv/tools/success_with") for r in rows for k in r)
    assert any(k.startswith("eval/ProductEnv/tools/") for k in read_jsonl(run / "metrics.jsonl")[-1])

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
