"""Tools from an MCP server on the Ray runtime: the env manager starts the stdio server in its own
process, the run logs the local run's values (tests/e2e/test_mcp_train.py's run, 2 steps), and no
server outlives its run."""

import psutil
import pytest

ray = pytest.importorskip("ray")

from mcp_servers import stdio_entry, write_server  # noqa: E402
from test_ray_runtime import ENGINE_LOGPROB_KEYS, _rows, cache, cluster  # noqa: E402,F401

from agentrl.api import fit  # noqa: E402

pytestmark = pytest.mark.ray

ENV = '''import re

from agentrl.registry import register_env

DEMONSTRATION = '<tool_call>\\n{"name": "add", "arguments": {"a": 6, "b": 36}}\\n</tool_call><answer>42</answer>'


class SumEnv:
    instructions = "Add with the add tool, then answer as <answer>N</answer>."

    async def reset(self, seed=None, options=None):
        self.a, self.b = 6 + (seed or 0) % 3, 36
        return f"What is {self.a} + {self.b}?", {}

    async def step(self, action):
        found = re.findall(r"<answer>\\s*(-?\\d+)\\s*</answer>", action)
        ok = bool(found) and int(found[-1]) == self.a + self.b
        return ("Correct." if ok else "Wrong."), float(ok), True, False, {"success": ok, "action_valid": bool(found)}

    def sample_action(self, rng):
        return DEMONSTRATION

    def close(self):
        pass


register_env("mcp_sum", SumEnv, overwrite=True)
'''


def test_an_mcp_servers_tool_trains_on_ray_as_locally(cluster, cache, tmp_path):  # noqa: F811 (the fixtures)
    (tmp_path / "mcp_sum_env.py").write_text(ENV)
    server = stdio_entry(write_server(tmp_path), name="calc",
                         env={"DROP_TOOLS": "slow,crash,huge,fail,pid,forged,interfaces",
                              "PID_FILE": str(tmp_path / "pids")})
    config = {"env": {"type": "mcp_sum", "max_turns": 1},
              "agent": {"type": "tool", "args": {"mcp_servers": [server], "max_tool_calls": 1}}}
    for kind in ("local", "ray"):
        fit(config, overrides=[
            f"imports=[{tmp_path / 'mcp_sum_env.py'}]", "model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2",
            "model.tiny.intermediate_size=128", "model.tiny.vocab_size=400", "model.warm_start.max_steps=100",
            "model.warm_start.min_steps=100", "model.warm_start.batch_size=8", "model.warm_start.demo_pool=4",
            "rollout.temperature=0.3", "rollout.batch_size=8", "rollout.group_size=4", "rollout.max_new_tokens=64",
            "actor.ppo_mini_batch_size=8", "actor.micro_batch_size=4", "trainer.total_steps=2",
            "trainer.test_freq=0", "trainer.save_freq=0", "trainer.progress=false", "trainer.logger=[jsonl]",
            f"model.cache_dir={cache}", f"run_dir={tmp_path / kind}", f"runtime.kind={kind}"], log=lambda m: None)
    local, remote = _rows(tmp_path / "local"), _rows(tmp_path / "ray")
    assert [r["step"] for r in remote] == [r["step"] for r in local]
    assert any(r.get("env/mcp_sum/tools/calls") for r in local)  # the server's tool was called
    # the server answers in a process of its own: the engine's batches follow arrival, as for the python tool
    differ = [(theirs["step"], k) for mine, theirs in zip(remote, local) for k in mine.keys() | theirs.keys()
              if mine.get(k) != theirs.get(k) and not (k in ENGINE_LOGPROB_KEYS
                                                       and mine.get(k) == pytest.approx(theirs.get(k), abs=1e-4))]
    assert differ == []
    # every server the runs started (the driver's, the env manager's) ends with its run: a server
    # whose env manager's process was ended sees its stdin close and exits (waited for, not timed)
    started = [psutil.Process(int(p)) for p in (tmp_path / "pids").read_text().split() if psutil.pid_exists(int(p))]
    _, alive = psutil.wait_procs(started, timeout=120)
    assert len((tmp_path / "pids").read_text().split()) >= 2 and alive == []
