"""Three-digit products: arithmetic the embedded model cannot do in its head, easy with the `python` tool.

## Description
The math env's synthetic problems with one multiplication of two operands from `min_operand`
to `max_operand` (100..999 by default): `What is 347 * 912?`. A tiny model guesses; a model
that prints the product with the `python` tool and copies the result answers right.

## Action format, observations, rewards, episode end
As the math env's (`envs/math.py`): `<answer>N</answer>`, one step per episode, graded by
math-verify.

## Demonstrations
Offered the `python` tool, the warm start demonstrates a call that prints the product
(`print(347 * 912)`), then the answer the tool printed; offered none, a well-formed answer with
a random number (`sample_action`, the math env's).

## Reference
The no-tool baseline (the same config with `agent.args.tools=[]`, configs/tool_python.yaml);
and, as the math env's, `eval_baselines`' `most_frequent_answer`.

## Arguments
`min_operand`, `max_operand`, `correct_reward`, `wrong_reward`, `format_penalty`, `timeout`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from agentrl.envs.math import MathEnv
from agentrl.registry import register_env

QUESTION = "What is "


class ProductsEnv(MathEnv):
    """What is A * B? (three-digit factors by default), answered as <answer>N</answer>."""

    needs_tools = True  # beyond the embedded model's head: the reward_without_tools alarm watches it

    def __init__(self, min_operand: int = 100, max_operand: int = 999, correct_reward: float = 1.0,
                 wrong_reward: float = 0.0, format_penalty: float = -0.1, timeout: float = 5.0) -> None:
        super().__init__(min_operand=min_operand, max_operand=max_operand, num_ops=1, ops="*",
                         correct_reward=correct_reward, wrong_reward=wrong_reward, format_penalty=format_penalty,
                         timeout=timeout)
        self.instructions = "Compute the product. Answer with the result only, as <answer>result</answer>."

    def demonstration(self, rng: random.Random, tools: Sequence[str]) -> list[Any]:
        """Offered `python`: a call printing the product, then its value as the answer; else a random answer."""
        if "python" not in tools or self.question is None:
            return [self.sample_action(rng)]
        expression = self.question.removeprefix(QUESTION).removesuffix("?")
        return [{"name": "python", "arguments": {"code": f"print({expression})"}}, f"<answer>{self.answer}</answer>"]


register_env("products", ProductsEnv)
