"""A user's module written as seeds 000/001 show it (AReaL's legacy agent API), run unchanged with
`agentrl train imports=[this file] env.type=seed-math-code-single-step agent.type=seed-math-multi-turn`.

The env has `reset` and `step` only (no close, no sample_action: its base is AReaL's own, not
agentrl's `EnvironmentService`, which would supply a `close`); its reset returns `(None, {})`,
the question comes from the dataset it is built with (`dataset_path`); the agent subclasses
`Agent`, loads its tokenizer from `tokenizer_path`, and returns the samples it built, with its
own reward shaping. The names differ from examples/seed_math_agent.py's only so both can be
registered in one test process.
"""

import abc
import asyncio
import json
from typing import List, Tuple

from transformers import AutoTokenizer

from agentrl import (Agent, BundledGenerationOutputs, EnvironmentService, GenerationHyperparameters, SequenceSample,
                     math_verify_call, register_agent, register_environment)

WRONG_REWARD = -0.25  # the agent's shaping: env steps give 1/0; a wrong try costs this instead


def load_id2info(dataset_path):
    with open(dataset_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {row["query_id"]: row for row in rows}


class AReaLEnvironmentService(abc.ABC):
    """AReaL's own base, as a user may keep it: reset and step, no close, no sample_action."""

    @abc.abstractmethod
    async def reset(self, seed=None, options=None): ...

    @abc.abstractmethod
    async def step(self, action): ...


class MathCodeSingleStepEnv(AReaLEnvironmentService):

    def __init__(self, dataset_path):
        self.id2info = load_id2info(dataset_path)

    async def reset(self, seed=None, options=None):
        return None, {}

    async def step(self, action: Tuple[str, List[str]]):
        qid, answers = action
        group_size = len(answers)
        qid = qid.split("@")[0]
        cur_task = self.id2info[qid]["task"]
        assert cur_task == "math"

        format_rewards = await asyncio.to_thread(
            math_verify_call,
            self.id2info,
            answers,
            [qid for _ in range(group_size)],
        )

        return None, format_rewards, True, False, {}


class NoDatasetEnv(EnvironmentService):
    """Like the seed's env, but built without a dataset: its prompts have nowhere to come from."""

    async def reset(self, seed=None, options=None):
        return None, {}

    async def step(self, action):
        return None, [0.0], True, False, {}


class MathMultiTurnAgent(Agent):
    def __init__(self, gconfig: GenerationHyperparameters, tokenizer_path: str, num_turns: int = 2,
                 turn_level_discount: float = 0.5):
        self.gconfig = gconfig.new(n=1)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.num_turns = num_turns
        self.turn_level_discount = turn_level_discount

    async def collect_trajectory(
        self,
        prompt: SequenceSample,
        env: EnvironmentService,
        obs_queue: asyncio.Queue,
        act_queue: asyncio.Queue,
    ) -> List[SequenceSample]:
        await env.reset()  # does nothing, just to make it like multi-step environments
        qid = prompt.ids[0]
        token_ids = list(prompt.data["packed_prompts"])
        samples = []
        for turn in range(self.num_turns):
            await obs_queue.put((qid, token_ids, self.gconfig))
            act: BundledGenerationOutputs = await act_queue.get()
            answers = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in act.output_ids]
            _, success, *_ = await env.step((qid, answers))
            reward = self.turn_level_discount ** turn if success[0] else WRONG_REWARD
            samples.append(SequenceSample.from_default(
                ids=[qid], seqlens=[len(act.seqs[0])],
                data=dict(packed_input_ids=act.seqs[0], rewards=[reward])))
            if success[0]:
                feedback = "Congratulations! You are correct!"
            else:
                feedback = "Unfortunately your answer is wrong. Let's try again."
            feedback = "\n" + self.tokenizer.apply_chat_template(
                [dict(content=feedback, role="user")],
                add_generation_prompt=True,
                tokenize=False,
            )
            if success[0]:
                break
            feedback = self.tokenizer(feedback, add_special_tokens=False)["input_ids"]
            token_ids = list(act.seqs[0]) + feedback
        return samples


register_environment("seed-math-code-single-step", MathCodeSingleStepEnv)
register_environment("seed-no-dataset", NoDatasetEnv)
register_agent("seed-math-multi-turn", MathMultiTurnAgent)
