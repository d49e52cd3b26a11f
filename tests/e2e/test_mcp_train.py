"""End-to-end: a short real training run of the tool agent whose only tool comes from an MCP server
(a stdio server built with the `mcp` SDK, agent.args.mcp_servers): the model's calls are run by the
server, its answers sit in the trained sequences as ids of loss mask 0 between the model's replies,
which are the engine's ids as sampled, and no server process is left once the run is over."""

import re

import psutil
import pytest
from helpers import segments
from mcp_servers import stdio_entry, write_server

from agentrl.api import fit, load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.metrics import read_jsonl

# The warm start's one demonstration: a fixed call of the server's `add`, learnt in a few steps
# (this run checks the plumbing, not learning); with max_tool_calls=1 the second reply is the answer.
DEMONSTRATION = '<tool_call>\n{"name": "add", "arguments": {"a": 6, "b": 36}}\n</tool_call><answer>42</answer>'


class SumEnv:
    """What is A + B? answered as <answer>N</answer>; one step per episode."""

    instructions = "Add with the add tool, then answer as <answer>N</answer>."

    async def reset(self, seed=None, options=None):
        self.a, self.b = 6 + (seed or 0) % 3, 36
        return f"What is {self.a} + {self.b}?", {}

    async def step(self, action):
        found = re.findall(r"<answer>\s*(-?\d+)\s*</answer>", action)
        ok = bool(found) and int(found[-1]) == self.a + self.b
        return ("Correct." if ok else "Wrong."), float(ok), True, False, {"success": ok, "action_valid": bool(found)}

    def sample_action(self, rng):
        return DEMONSTRATION

    def close(self):
        pass


@pytest.fixture(scope="module")
def mcp_run(tmp_path_factory):
    """(the run folder of 3 training steps, dumped at each; the file of the server's pids)."""
    tmp_path = tmp_path_factory.mktemp("mcp_train")
    pids = tmp_path / "pids"
    # `add` only: a short system prompt (the other tools are for tests/tools/test_mcp.py)
    server = stdio_entry(write_server(tmp_path), name="calc",
                         env={"PID_FILE": str(pids), "DROP_TOOLS": "slow,crash,huge,fail,pid,forged,interfaces"})
    run = tmp_path / "run"
    cfg = load_config({"exp_name": "mcp", "env": {"max_turns": 1},
                       "agent": {"type": "tool", "args": {"mcp_servers": [server], "max_tool_calls": 1}}}, [
        "model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.vocab_size=400", "model.warm_start.max_steps=100", "model.warm_start.min_steps=100",
        "model.warm_start.batch_size=8", "model.warm_start.demo_pool=4", "rollout.temperature=0.3",
        "rollout.batch_size=8", "rollout.group_size=4", "rollout.max_new_tokens=64",
        "actor.ppo_mini_batch_size=8", "actor.micro_batch_size=4", "trainer.total_steps=3", "trainer.test_freq=3",
        "trainer.eval_episodes=4", "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]",
        "trainer.dump_trajectories_freq=1", f"run_dir={run}", f"model.cache_dir={tmp_path / 'cache'}"])
    fit(cfg, env_cls=SumEnv)
    return run, pids


def test_the_tool_agent_trains_with_an_mcp_servers_tool(mcp_run):
    run, _ = mcp_run
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for name in ("calls", "malformed", "errors", "timeouts", "used"):  # MCP calls are counted as ours
        assert all(f"env/SumEnv/tools/{name}" in r for r in rows), name
    assert sum(r["env/SumEnv/tools/calls"] for r in rows) > 0
    ran = 0
    for dump in (read_dump(path) for _, path in list_dumps(run)):
        pieces = dump["pieces"]
        for ep in dump["episodes"]:
            mask = [int(m) for m in ep["mask"]]
            spans = segments(mask)
            between = ["".join(pieces[str(i)] for i in ep["ids"][a:b]) for (_, a), (b, _) in zip(spans, spans[1:])]
            reply = "".join(pieces[str(i)] for i in ep["ids"][spans[0][0]:spans[0][1]])
            if between and reply.startswith(DEMONSTRATION):  # the call as demonstrated: the server's own answer
                assert between[0].startswith("\n<|im_start|>tool\n42<|im_end|>")
                ran += 1
            # the replies are the engine's samples: the trainer scores each id as the engine did
            gen = [k for k, m in enumerate(mask) if m]
            assert len(ep["lp"]) == len(ep["old"]) == len(gen) > 0
            assert all(abs(a - b) < 1e-3 for a, b in zip(ep["lp"], ep["old"]))
    assert ran > 0


def test_no_server_process_is_left_after_the_run(mcp_run):
    _, pids = mcp_run
    started = [int(p) for p in pids.read_text().split()]
    assert started  # the run started its server (the warm start's and the run's agents share it)
    assert not [p for p in started if psutil.pid_exists(p)]
