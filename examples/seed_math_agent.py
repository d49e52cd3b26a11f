"""The seeds' multi-turn math agent and single-step math env, written in AReaL's legacy style.

Nothing here knows agentrl's own agent contract: the agent talks to the engine through two
queues and steps its env with `(qid, answers)`, as in the seeds. agentrl runs it unchanged
through `agentrl.agents.compat.SeedAgentAdapter`. Use it from a config:

    imports: [examples/seed_math_agent.py]
    env: {type: math-code-single-step, max_turns: 3, args: {max_operand: 4}}
    agent: {type: math-multi-turn, args: {turn_level_discount: 0.5}}
"""

from __future__ import annotations

import asyncio
import random

from agentrl.envs.math import MathEnv
from agentrl.envs.math_grader import shared_grader
from agentrl.envs.text import answer_content
from agentrl.registry import register_agent, register_env


class MathCodeSingleStepEnv:
    """A stateless wrapper around the reward function: grades a group of answers to one question."""

    def __init__(self, timeout: float = 5.0, **problem_args) -> None:
        self.problems = MathEnv(timeout=timeout, **problem_args)  # the question source (synthetic or a file)
        self.instructions = self.problems.instructions
        self.timeout = timeout
        self.id2info: dict[str, dict] = {}

    async def reset(self, seed=None, options=None):
        question, info = await self.problems.reset(seed=seed)
        qid = f"q{info['question_seed']}"
        self.id2info[qid] = {"answer": self.problems.answer}
        return question, {"qid": qid}

    async def step(self, action):
        qid, answers = action
        gold = self.id2info[qid.split("@")[0]]["answer"]
        grades = await asyncio.gather(*(shared_grader().grade(gold, answer_content(a), self.timeout)
                                        for a in answers))
        return None, [float(g.correct) for g in grades], True, False, {}

    def sample_action(self, rng: random.Random) -> str:
        return self.problems.sample_action(rng)

    def close(self) -> None:
        self.problems.close()


class MathMultiTurnAgent:
    """AReaL's MathMultiTurnAgent: answer, hear the verdict, try again, `num_turns` times at most."""

    def __init__(self, gconfig, tokenizer, turn_level_discount: float = 1.0, num_turns: int = 3) -> None:
        self.gconfig = gconfig.new(n=1)
        self.tokenizer = tokenizer
        self.turn_level_discount = turn_level_discount
        self.num_turns = num_turns

    async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
        await env.reset()  # does nothing, just to make it like multi-step environments
        qid = prompt.ids[0]
        token_ids = list(prompt.data["packed_prompts"])
        rewards, solved = [], False
        for turn in range(self.num_turns):
            await obs_queue.put((qid, token_ids, self.gconfig))
            act = await act_queue.get()
            answers = [self.tokenizer.decode(out, skip_special_tokens=True) for out in act.output_ids]
            _, success, *_ = await env.step((qid, answers))
            solved = bool(success[0])
            rewards.append(float(success[0]) * self.turn_level_discount ** turn)
            if solved:
                break
            feedback = "\n" + self.tokenizer.apply_chat_template(
                [dict(content="Unfortunately your answer is wrong. Let's try again.", role="user")],
                add_generation_prompt=True, tokenize=False)
            token_ids = list(act.seqs[0]) + self.tokenizer(feedback, add_special_tokens=False)["input_ids"]
        return {"rewards": rewards, "success": solved}


register_env("math-code-single-step", MathCodeSingleStepEnv)
register_agent("math-multi-turn", MathMultiTurnAgent)
