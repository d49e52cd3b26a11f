"""The retry agent: feedback between tries as pre-tokenised ids (mask 0), discounted turn rewards,
success within k tries; and every agent's token budget and context limit."""

import asyncio

import pytest

from agentrl.agents.chat import ChatAgent
from agentrl.agents.math_retry import WRONG, MathRetryAgent
from agentrl.envs.math import MathEnv
from agentrl.envs.math_grader import shutdown_grader
from agentrl.llm.conversation import TokenBudget
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.collector import RolloutCollector
from agentrl.trajectory import Task
from helpers import RecordingEngine, segments


@pytest.fixture(scope="module", autouse=True)
def _stop_grader():
    yield
    shutdown_grader()


class ScriptedReplies:
    """An LLM client that answers with the next of a fixed list of texts (plus EOS)."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.outputs = tokenizer, list(replies), []

    async def generate(self, prompt_ids, sampling):
        text = self.replies.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling.max_new_tokens - 1]
        ids.append(self.tokenizer.eos_token_id)
        self.outputs.append(ids)
        return Completion(ids, [-0.5] * len(ids), "stop")


def _episode(agent, env, llm, seed=0, greedy=False):
    return asyncio.run(agent.run_episode(Task(env_seed=seed, group_id=0, sampling_seed=1, greedy=greedy), env, llm))


def test_wrong_then_right_with_feedback_and_discount(tiny_tokenizer):
    env = MathEnv(max_operand=4)
    asyncio.run(env.reset(seed=7))
    right = env.answer
    wrong = str(int(right) + 1)
    llm = ScriptedReplies(tiny_tokenizer, [f"<answer>{wrong}</answer>", "<answer></answer>", f"<answer>{right}</answer>"])
    agent = MathRetryAgent(tiny_tokenizer, SamplingParams(max_new_tokens=16), max_turns=4, turn_discount=0.5)
    traj = _episode(agent, env, llm, seed=7)
    # wrong (0), unparseable (format penalty, discounted), right on the third try: 0.5 ** 2
    assert traj.rewards == pytest.approx([0.0, -0.1 * 0.5, 0.25])
    assert traj.success and traj.num_turns == 3 and traj.truncation_reason is None
    assert traj.info["metrics"] == {"success_at_1": 0.0, "success_at_2": 0.0, "success_at_3": 1.0, "success_at_4": 1.0,
                                    "grader_timeout": 0.0}
    assert traj.invalid_actions == 1
    # generated ids are exactly the client's, with mask 1 and their logprobs; rewards on their last id
    segs = segments(traj.loss_mask)
    assert [traj.token_ids[a:b] for a, b in segs] == llm.outputs
    assert traj.reward_positions == [b - 1 for _, b in segs]
    assert all(traj.logprobs[i] == -0.5 for a, b in segs for i in range(a, b))
    # between two tries: the feedback, rendered by the template, tokenised once for the agent
    text, ids = agent._feedback
    assert WRONG in text and ids == tiny_tokenizer.encode(text, add_special_tokens=False)
    between = traj.token_ids[segs[0][1]:segs[1][0]]
    assert ids == between[len(between) - len(ids) - len(_header(tiny_tokenizer)):len(between) - len(_header(tiny_tokenizer))]
    # the whole sequence is what the chat template renders for these messages
    conv_text = tiny_tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert conv_text.count(WRONG) == 2 and conv_text.count("<|im_start|>assistant") == 3


def _header(tokenizer):
    return tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)


def test_all_wrong_ends_at_max_turns(tiny_tokenizer):
    llm = ScriptedReplies(tiny_tokenizer, ["<answer>99</answer>"] * 3)
    agent = MathRetryAgent(tiny_tokenizer, SamplingParams(max_new_tokens=16), max_turns=3)
    traj = _episode(agent, MathEnv(max_operand=4), llm)
    assert traj.rewards == [0.0, 0.0, 0.0] and not traj.success
    assert traj.truncation_reason == "max_turns" and traj.truncated
    assert set(traj.info["metrics"].values()) == {0.0} and "grader_timeout" in traj.info["metrics"]
    # no feedback after the last try: the sequence ends with the last reply's closing
    assert tiny_tokenizer.decode(traj.token_ids).count(WRONG) == 2


def test_real_engine_episode_is_token_exact(tiny_model, tiny_tokenizer):
    engine = RecordingEngine(LocalEngine(tiny_model, eos_token_ids=(tiny_tokenizer.eos_token_id,),
                                         pad_token_id=tiny_tokenizer.pad_token_id))
    agent = MathRetryAgent(tiny_tokenizer, SamplingParams(max_new_tokens=6, stop_token_ids=(tiny_tokenizer.eos_token_id,)),
                           max_turns=3)
    collector = RolloutCollector.single(lambda: MathEnv(max_operand=4), agent, engine, tag="math")
    result = collector.collect([Task(env_seed=s, group_id=s, sampling_seed=s, tag="math") for s in range(4)])
    assert not result.errors and len(result.trajectories) == 4
    calls = engine.served()
    n_turns = 0
    for traj in result.trajectories:
        assert traj.tag == "math"
        for a, b in segments(traj.loss_mask):  # each reply: the engine's ids for exactly this prompt
            out = calls[(tuple(traj.token_ids[:a]), tuple(traj.token_ids[a:b]))]
            assert traj.logprobs[a:b] == out.logprobs
            n_turns += 1
    assert n_turns == len(engine.calls)


class Countdown:
    """Any reply moves on; the episode would last `n` turns."""

    instructions = "Say anything at all, as long as you like."

    def __init__(self, n=50):
        self.n = n

    async def reset(self, seed=None, options=None):
        self.left = self.n
        return "Many turns are left, keep talking please.", {}

    async def step(self, action):
        self.left -= 1
        return "Many turns are left, keep talking please.", 1.0, self.left == 0, False, {"success": self.left == 0}

    def sample_action(self, rng):
        return "ok"

    def close(self):
        pass


def test_context_limit_ends_the_episode_as_truncated_with_its_reason(tiny_tokenizer):
    llm = ScriptedReplies(tiny_tokenizer, ["a few words of reply"] * 50)
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=50, budget=TokenBudget(context=120))
    traj = _episode(agent, Countdown(), llm)
    assert traj.truncated and traj.truncation_reason == "context"
    assert 1 < traj.num_turns < 50 and len(traj.token_ids) <= 120
    # the last observation, which no reply could follow, is not in the sequence
    assert tiny_tokenizer.decode(traj.token_ids, skip_special_tokens=False).rstrip().endswith("<|im_end|>")
    assert len(traj.turn_states) == traj.num_turns


def test_context_limit_caps_a_reply_and_never_asks_the_engine_for_too_much(tiny_model, tiny_tokenizer):
    engine = LocalEngine(tiny_model, eos_token_ids=(tiny_tokenizer.eos_token_id,),
                         pad_token_id=tiny_tokenizer.pad_token_id, max_model_len=160)
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=40), max_turns=50, budget=TokenBudget(context=160))
    collector = RolloutCollector.single(lambda: Countdown(), agent, engine)
    result = collector.collect([Task(env_seed=0, group_id=k, sampling_seed=k) for k in range(3)])
    assert not result.errors  # the engine would raise EngineError on prompt + max_new_tokens > 160
    for traj in result.trajectories:
        assert traj.truncation_reason == "context" and len(traj.token_ids) <= 160


def test_episode_token_budget(tiny_tokenizer):
    llm = ScriptedReplies(tiny_tokenizer, ["one two three four five six"] * 50)
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=50,
                      budget=TokenBudget(episode_tokens=20))
    traj = _episode(agent, Countdown(), llm)
    assert traj.truncation_reason == "token_budget" and traj.num_generated <= 20
    assert traj.num_generated == 20  # the last reply was cut to what was left


def test_turn_limit_and_env_truncation_reasons(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=3)
    traj = _episode(agent, Countdown(), ScriptedReplies(tiny_tokenizer, ["x"] * 3))
    assert traj.truncation_reason == "max_turns" and traj.num_turns == 3
    traj = _episode(agent, Countdown(n=2), ScriptedReplies(tiny_tokenizer, ["x"] * 3))
    assert traj.truncation_reason is None and traj.terminated
