"""The one episode loop (agents/loop.py): a new kind of agent is a hook on `Episode`, and an episode
can be played one turn at a time (as several agents of one episode will be)."""

import asyncio

from agentrl.agents.chat import ChatAgent
from agentrl.agents.loop import Episode, TurnAgent
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.tasks import make_tasks
from agentrl.trajectory import Task
from helpers import ScriptedReplies, segments

MOVES = ["Left", "Down", "Right", "Up"]
HINT = "Hint: the goal is down and to the right."


class HintEpisode(Episode):
    """The chat agent's episode, with a hint after every observation: one hook."""

    def tell(self, obs):
        super().tell(obs)
        self.conv.add_message("user", HINT)


class HintAgent(TurnAgent):
    """A new kind of agent: its settings, and its episode's hook."""

    async def run_episode(self, task, env, llm):
        obs, _ = await env.reset(seed=task.env_seed)
        return await HintEpisode(self, task, env, llm, obs).play()


class SeededMoves:
    """An LLM client whose reply depends only on the request's sampling seed (not on call order)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def generate(self, prompt_ids, sampling):
        text = f"<answer>{MOVES[sampling.seed % 4]}</answer>"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Completion(ids, [-0.25] * len(ids), "stop")


def _env():
    return FrozenLakeEnv(map_name=None, max_steps=6)


def test_a_new_agent_kind_is_one_hook_and_stays_token_exact(tiny_tokenizer):
    replies = ["<answer>Down</answer>", "<answer>Right</answer>", "<answer>Down</answer>", "<answer>Right</answer>"]
    llm = ScriptedReplies(tiny_tokenizer, replies)
    agent = HintAgent(tiny_tokenizer, SamplingParams(max_new_tokens=16), max_turns=3)
    traj = asyncio.run(agent.run_episode(Task(env_seed=3, group_id=0, sampling_seed=1), _env(), llm))
    segs = segments(traj.loss_mask)
    assert [traj.token_ids[a:b] for a, b in segs] == llm.outputs  # the engine's ids verbatim, mask 1
    for (start, _), prompt in zip(segs, llm.prompts):
        assert traj.token_ids[:start] == prompt  # each prompt was exactly the sequence so far
    assert traj.num_turns == 3 and traj.truncation_reason == "max_turns"  # the loop's stop reason
    between = tiny_tokenizer.decode(traj.token_ids[segs[0][1]:segs[1][0]])
    assert HINT in between  # the hook's message follows the observation, as ids we wrote (mask 0)
    assert traj.reward_positions == [b - 1 for _, b in segs]


def test_a_new_agent_kind_runs_through_the_collector(tiny_tokenizer):
    agent = HintAgent(tiny_tokenizer, SamplingParams(max_new_tokens=16), max_turns=4)
    result = RolloutCollector.single(_env, agent, SeededMoves(tiny_tokenizer)).collect(make_tasks(0, 0, 2, 2))
    assert not result.errors and len(result.trajectories) == 4
    longer = [t for t in result.trajectories if t.num_turns > 1]
    assert longer and all(HINT in tiny_tokenizer.decode(t.token_ids) for t in longer)


def test_episodes_played_turn_by_turn_interleaved_equal_each_played_alone(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=16), max_turns=5)
    llm = SeededMoves(tiny_tokenizer)
    tasks = [Task(env_seed=s, group_id=0, sampling_seed=10 + s) for s in (1, 4)]

    async def alone(task):
        env = _env()
        obs, _ = await env.reset(seed=task.env_seed)
        return await Episode(agent, task, env, llm, obs).play()

    async def interleaved():
        episodes = []
        for task in tasks:
            env = _env()
            obs, _ = await env.reset(seed=task.env_seed)
            episodes.append(Episode(agent, task, env, llm, obs))
        while any(not e.over and e.steps < agent.max_turns for e in episodes):
            for e in episodes:  # one turn each, in turn: the shape of several agents in one episode
                if not e.over and e.steps < agent.max_turns:
                    await e.play_turn()
        return [e.finish() for e in episodes]

    together = asyncio.run(interleaved())
    apart = [asyncio.run(alone(t)) for t in tasks]
    assert together == apart
    assert [t.num_turns for t in together] != [1, 1]  # multi-turn episodes, so turns did interleave
    direct = [asyncio.run(agent.run_episode(t, _env(), llm)) for t in tasks]
    assert direct == apart  # the chat agent is that loop
