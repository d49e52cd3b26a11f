"""The trainer's watch (agentrl/train/watch.py): the cross-scoring behind health/input_dependence,
and the tool alarms raised from the tool agent's episodes step after step."""

import asyncio

import pytest
import torch

from agentrl.agents.tool import ToolAgent
from agentrl.config import load_config
from agentrl.envs.math import MathEnv
from agentrl.envs.math_grader import shutdown_grader
from agentrl.llm.engine import SamplingParams
from agentrl.tools import tool
from agentrl.train.actor import Actor, token_logprobs
from agentrl.train.watch import Watch
from agentrl.trajectory import Task
from helpers import ScriptedReplies


@pytest.mark.parametrize("micro_batch_size", [1, 16])  # one context per pass, or all in one
def test_cross_scoring_with_a_shared_cache_equals_scoring_whole_sequences(tiny_model, tiny_tokenizer, tmp_path,
                                                                         micro_batch_size):
    cfg = load_config(None, [f"actor.micro_batch_size={micro_batch_size}"])
    watch = Watch(cfg, tmp_path, tiny_tokenizer, Actor(tiny_model, cfg.actor, temperature=0.7))
    enc = tiny_tokenizer.encode
    pairs = [(enc("user\nP _ _ _\n_ O _ O"), enc("<answer>Left</answer>")),
             (enc("user\nFrozenLake. Move P to G"), enc("<answer>Down")),
             (enc("system\nWhat is 12 + 7?"), enc("19"))]
    got = watch.cross_loglik(pairs)
    for i, (_, reply) in enumerate(pairs):
        for j, (context, _) in enumerate(pairs):
            ids = torch.tensor([context + reply])
            with torch.no_grad():
                logp = token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=0.7)
            assert abs(got[i][j] - float(logp[0, len(context):].sum())) < 1e-3


# ---------------------------------------------------------------------------- the tool alarms
# Each step: 4 episodes of three-digit products played by the real tool agent on the real math env,
# the model's replies written out per step; the trainer's watch reads the step's trajectories as
# a run would, and warns of the alarms that start (the lines a run logs).
@tool(name="watch_multiply")
def multiply(a: int, b: int) -> str:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return str(a * b)


class NeedsToolsProducts(MathEnv):
    """Three-digit products, declared to need tools (the env's attribute)."""

    needs_tools = True

    def __init__(self):
        super().__init__(min_operand=100, max_operand=999, ops="*")


def _products():
    return MathEnv(min_operand=100, max_operand=999, ops="*")


def _call(expr):
    a, b = (int(x) for x in expr.split(" * "))
    return f'<tool_call>\n{{"name": "watch_multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'


def _watch_steps(tokenizer, actor, tmp_path, script, steps, make_env=_products, **agent_args):
    """Play `steps` steps; `script(step, k, expr, answer)` gives the replies of episode k. Returns the
    health metrics of each step and the lines the watch logged."""
    cfg = load_config(None, ["health.warmup_steps=1", "health.patience=2", "health.mi_inputs=0"])
    lines = []
    watch = Watch(cfg, tmp_path, tokenizer, actor, log=lines.append)
    agent = ToolAgent(tokenizer, SamplingParams(max_new_tokens=96), max_turns=1, max_tool_calls=2, **agent_args)
    rows = []
    for step in range(1, steps + 1):
        trajs = []
        for k in range(4):
            env, seed = make_env(), 100 * step + k
            asyncio.run(env.reset(seed=seed))
            expr, answer = env.question[len("What is "):-1], env.answer
            llm = ScriptedReplies(tokenizer, script(step, k, expr, answer))
            trajs.append(asyncio.run(agent.run_episode(Task(env_seed=seed, group_id=k, sampling_seed=seed), env, llm)))
        rows.append(watch.health(step, trajs, {}))
        watch.act(step)
    return rows, lines


@pytest.fixture(scope="module", autouse=True)
def _stop_grader():
    yield
    shutdown_grader()


@pytest.fixture
def actor(tiny_model):
    return Actor(tiny_model, load_config(None, []).actor, temperature=1.0)


def _fired(lines, name):
    return [line for line in lines if f": {name}: " in line]


def test_reward_rising_without_a_tool_call_on_a_task_that_needs_tools_raises_the_alarm(tiny_tokenizer, actor,
                                                                                        tmp_path):
    # the model learns to answer right without ever calling the tool (agentcore-rl-toolkit PR #97)
    def direct(step, k, expr, answer):
        return [f"<answer>{answer if step > 2 else 0}</answer>"]

    rows, lines = _watch_steps(tiny_tokenizer, actor, tmp_path, direct, 6, make_env=NeedsToolsProducts,
                               tools=["watch_multiply"])
    assert [r["health/tool_use"] for r in rows] == [0.0] * 6
    assert [r["health/tool_task_reward"] for r in rows] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    fired = _fired(lines, "reward_without_tools")
    assert len(fired) == 1 and "at step 4:" in fired[0] and "health.reward_without_tools_rise=0.1" in fired[0]
    assert [r["health/alarm_reward_without_tools"] for r in rows] == [0, 0, 0, 1, 1, 1]
    # declared by the config instead of the env: the same alarm
    _, lines = _watch_steps(tiny_tokenizer, actor, tmp_path, direct, 6, tools=["watch_multiply"], needs_tools=True)
    assert len(_fired(lines, "reward_without_tools")) == 1


def test_reward_rising_with_tool_calls_or_on_the_no_tool_baseline_raises_no_alarm(tiny_tokenizer, actor, tmp_path):
    def with_tool(step, k, expr, answer):  # the same rewards, reached with the tool
        return [_call(expr), f"<answer>{answer if step > 2 else 0}</answer>"]

    rows, lines = _watch_steps(tiny_tokenizer, actor, tmp_path, with_tool, 6, make_env=NeedsToolsProducts,
                               tools=["watch_multiply"])
    assert [r["health/tool_use"] for r in rows] == [1.0] * 6
    assert [r["health/tool_task_reward"] for r in rows] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert not _fired(lines, "reward_without_tools") and not any(r["health/alarm_reward_without_tools"] for r in rows)

    def direct(step, k, expr, answer):
        return [f"<answer>{answer if step > 2 else 0}</answer>"]

    # the no-tool baseline (tools off) on the same task is not watched; nor is a task not declared
    for args, make_env in (({"tools": []}, NeedsToolsProducts), ({"tools": ["watch_multiply"]}, _products)):
        rows, lines = _watch_steps(tiny_tokenizer, actor, tmp_path, direct, 6, make_env=make_env, **args)
        assert not _fired(lines, "reward_without_tools") and not any("health/tool_use" in r for r in rows)


def test_malformed_calls_rising_raise_the_alarm(tiny_tokenizer, actor, tmp_path):
    # the calls were well formed, then the format breaks down (verl #6252)
    def breaking(step, k, expr, answer):
        call = _call(expr) if step <= 3 else _call(expr).replace('"name": ', '"name" ')
        return [call, f"<answer>{answer}</answer>"]

    rows, lines = _watch_steps(tiny_tokenizer, actor, tmp_path, breaking, 7, tools=["watch_multiply"])
    assert [r["health/malformed_calls"] for r in rows] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    fired = _fired(lines, "malformed_calls")
    assert len(fired) == 1 and "at step 5:" in fired[0] and "health.malformed_calls_rise=0.2" in fired[0]
    assert rows[-1]["health/alarm_malformed_calls"] == 1.0


def test_malformed_calls_falling_or_steady_raise_no_alarm(tiny_tokenizer, actor, tmp_path):
    # an untrained model's calls are malformed at first: learning the format is no collapse
    def learning(step, k, expr, answer):
        call = _call(expr).replace('"name": ', '"name" ') if step <= 3 else _call(expr)
        return [call, f"<answer>{answer}</answer>"]

    rows, lines = _watch_steps(tiny_tokenizer, actor, tmp_path, learning, 7, tools=["watch_multiply"])
    assert [r["health/malformed_calls"] for r in rows] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert not _fired(lines, "malformed_calls") and not any(r["health/alarm_malformed_calls"] for r in rows)

    def steady(step, k, expr, answer):  # one episode of the four writes a malformed call, every step
        call = _call(expr).replace('"name": ', '"name" ') if k == 0 else _call(expr)
        return [call, f"<answer>{answer}</answer>"]

    rows, lines = _watch_steps(tiny_tokenizer, actor, tmp_path, steady, 7, tools=["watch_multiply"])
    assert [r["health/malformed_calls"] for r in rows] == [0.25] * 7 and not _fired(lines, "malformed_calls")
