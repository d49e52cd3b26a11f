"""Seed-style (AReaL legacy) agents and envs run unchanged, with token-exact trajectories."""

import asyncio
from pathlib import Path

import pytest

from agentrl.agents.compat import GenerationOutput, SeedAgentAdapter, SeedPrompt, is_seed_agent
from agentrl.envs.math_grader import shutdown_grader
from agentrl.errors import ConfigError
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.registry import AGENTS, ENVS
from agentrl.rollout.collector import RolloutCollector
from agentrl.runtime.assembly.envs import import_user_modules
from agentrl.trajectory import Task
from helpers import RecordingEngine, segments

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "seed_math_agent.py")
SAMPLING = SamplingParams(max_new_tokens=6)


@pytest.fixture(scope="module", autouse=True)
def _example():
    import_user_modules([EXAMPLE])
    yield
    shutdown_grader()


def test_example_is_registered_and_detected_as_seed_style():
    agent_cls = AGENTS.get("math-multi-turn")
    assert is_seed_agent(agent_cls) and not is_seed_agent(AGENTS.get("chat"))
    assert "math-code-single-step" in ENVS
    import_user_modules([EXAMPLE])  # a second import registers nothing twice


def test_seed_agent_runs_real_episodes_through_the_local_engine(tiny_model, tiny_tokenizer):
    engine = RecordingEngine(LocalEngine(tiny_model, eos_token_ids=(tiny_tokenizer.eos_token_id,),
                                         pad_token_id=tiny_tokenizer.pad_token_id))
    adapter = SeedAgentAdapter.from_class(AGENTS.get("math-multi-turn"), tiny_tokenizer, SAMPLING, max_turns=3,
                                          args={"turn_level_discount": 0.5})
    env_cls = ENVS.get("math-code-single-step")
    collector = RolloutCollector.single(lambda: env_cls(max_operand=4), adapter, engine, tag="seed")
    result = collector.collect([Task(env_seed=s, group_id=s, sampling_seed=s, tag="seed") for s in range(6)])
    assert not result.errors and len(result.trajectories) == 6
    calls = engine.served()
    feedback = tiny_tokenizer("\n" + tiny_tokenizer.apply_chat_template(
        [dict(content="Unfortunately your answer is wrong. Let's try again.", role="user")],
        add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
    for traj in result.trajectories:
        segs = segments(traj.loss_mask)
        assert 1 <= len(segs) == traj.num_turns <= 3
        for a, b in segs:  # every reply: the engine's exact ids and logprobs for exactly that prompt
            out = calls[(tuple(traj.token_ids[:a]), tuple(traj.token_ids[a:b]))]
            assert traj.logprobs[a:b] == out.logprobs
        for (_, b), (a2, _) in zip(segs, segs[1:]):  # between tries: the agent's own feedback ids
            assert traj.token_ids[b:a2] == feedback
        solved = traj.success
        assert traj.rewards == [0.0] * (len(segs) - 1) + [0.5 ** (len(segs) - 1) if solved else 0.0]
        assert solved or len(segs) == 3
    assert sum(len(segments(t.loss_mask)) for t in result.trajectories) == len(engine.calls)


class ScriptedReplies:
    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies = tokenizer, list(replies)

    async def generate(self, prompt_ids, sampling):
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Completion(ids, [-1.0] * len(ids), "stop", policy_version=3)


class EchoEnv:
    """A seed-style env: reset gives the question; step((qid, answers)) returns one reward per answer."""

    instructions = "Answer."

    async def reset(self, seed=None, options=None):
        return f"Question {seed}", {"qid": f"id{seed}"}

    async def step(self, action):
        qid, answers = action
        return None, [float("yes" in a) for a in answers], True, False, {}

    def close(self):
        pass


def test_queue_shapes_are_the_seeds(tiny_tokenizer):
    seen = {}

    class ShapeAgent:
        def __init__(self, gconfig, num_turns):
            self.gconfig, self.num_turns = gconfig, num_turns

        async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
            seen["prompt"] = prompt
            seen["reset"] = await env.reset()
            token_ids = list(prompt.data["packed_prompts"])
            for _ in range(self.num_turns):
                await obs_queue.put((prompt.ids[0], token_ids, self.gconfig))
                act = await act_queue.get()
                seen.setdefault("acts", []).append(act)
                answers = [tiny_tokenizer.decode(o, skip_special_tokens=True) for o in act.output_ids]
                seen.setdefault("steps", []).append(await env.step((prompt.ids[0], answers)))
                token_ids = list(act.seqs[0]) + tiny_tokenizer.encode("\nagain\n", add_special_tokens=False)

    adapter = SeedAgentAdapter.from_class(ShapeAgent, tiny_tokenizer, SAMPLING, max_turns=2)
    traj = asyncio.run(adapter.run_episode(Task(env_seed=5, group_id=0, sampling_seed=0), EchoEnv(),
                                           ScriptedReplies(tiny_tokenizer, ["no", "yes"])))
    prompt = seen["prompt"]
    assert isinstance(prompt, SeedPrompt) and prompt.ids == ["id5"] and prompt.bs == 1
    assert seen["reset"] == ("Question 5", {"qid": "id5"})  # the agent's reset replays the first observation
    first, second = seen["acts"]
    assert isinstance(first, GenerationOutput) and first.qid == "id5"
    assert first.seqs[0] == first.prompt_ids + first.output_ids[0] and first.prompt_len == len(prompt.token_ids)
    assert first.seqlens == [len(first.seqs[0])] and first.no_eos == [False] and first.version_start == [3]
    assert [s[1] for s in seen["steps"]] == [[0.0], [1.0]]
    # rewards came back from the env's steps; the sequence is prompt, reply, feedback, reply
    assert traj.rewards == [0.0, 1.0] and traj.success and traj.num_turns == 2
    generated = len(first.output_ids[0]) + len(second.output_ids[0])
    assert traj.token_ids == second.seqs[0] and sum(traj.loss_mask) == generated
    assert traj.versions.count(3) == generated and traj.truncation_reason is None


def test_a_prompt_that_does_not_extend_the_sequence_fails_the_episode(tiny_tokenizer):
    class Restarter:
        def __init__(self, gconfig):
            self.gconfig = gconfig

        async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
            for _ in range(2):  # sends the first prompt again instead of extending act.seqs[0]
                await obs_queue.put((prompt.ids[0], list(prompt.data["packed_prompts"]), self.gconfig))
                await act_queue.get()

    adapter = SeedAgentAdapter.from_class(Restarter, tiny_tokenizer, SAMPLING, max_turns=3)
    collector = RolloutCollector.single(EchoEnv, adapter, ScriptedReplies(tiny_tokenizer, ["a", "b"]))
    result = collector.collect([Task(env_seed=0, group_id=0, sampling_seed=0)])
    assert not result.trajectories and "do not extend" in result.errors[0]


def test_the_turn_limit_stops_a_seed_agent(tiny_tokenizer):
    class Forever:
        def __init__(self, gconfig):
            self.gconfig = gconfig

        async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
            ids = list(prompt.data["packed_prompts"])
            while True:
                await obs_queue.put((prompt.ids[0], ids, self.gconfig))
                ids = list((await act_queue.get()).seqs[0])

    adapter = SeedAgentAdapter.from_class(Forever, tiny_tokenizer, SAMPLING, max_turns=3)
    traj = asyncio.run(adapter.run_episode(Task(env_seed=0, group_id=0, sampling_seed=0), EchoEnv(),
                                           ScriptedReplies(tiny_tokenizer, ["x"] * 5)))
    assert traj.num_turns == 3 and traj.truncation_reason == "max_turns"


def test_missing_constructor_argument_is_a_config_error(tiny_tokenizer):
    class NeedsPath:
        def __init__(self, gconfig, dataset_path):
            pass

        async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
            pass

    with pytest.raises(ConfigError, match="needs argument 'dataset_path'; set agent.args.dataset_path"):
        SeedAgentAdapter.from_class(NeedsPath, tiny_tokenizer, SAMPLING, max_turns=2)
