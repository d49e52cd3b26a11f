"""Math as a text env: one question, one answer, graded by math-verify.

## Description
A question, and a reward for answering it right. The questions are synthetic arithmetic
(`dataset_path` null: difficulty set by operand size and operation count) or the
`question`/`answer` rows of the user's JSONL or Parquet file, read with Hugging Face
`datasets`. Whether an answer is right is decided by the `math-verify` library, so `0.5`,
`1/2` and `\\boxed{\\frac{1}{2}}` all equal a reference `1/2`.

## Action format
The content of the reply's last `<answer>...</answer>` (or of an unclosed `<answer>` tail) is
read as one expression, LaTeX delimiters optional (`x + 1`, `\\frac{1}{2}`, `0.5`); a reply
without an answer tag is free text in which math-verify finds the final answer (a number,
`\\boxed{...}`, `$...$`). The reference answer is always read as one expression. A reply in
which nothing can be read is invalid.

## Observation format
The question, e.g. `What is 3 + 4?`; after a step, `Correct.` or `Wrong.` (never the answer).

## Starting state
`reset(seed)` picks the question: a synthetic problem drawn from `random.Random(seed)`, or row
`seed % len(rows)` of the file. The same seed gives the same question.

## Rewards
`correct_reward` for a right answer, `wrong_reward` for a wrong one, `format_penalty` when no
answer can be found. Grading runs in a worker process off the event loop (see
`math_grader.py`); an answer not graded within `timeout` seconds (a pathological expression) is
wrong, and `info["metrics"]["grader_timeout"]` records it.

## Episode end
Every step ends the episode (terminated; `info["success"]` says whether the answer was right).
The env keeps its question until the next reset, so `step` may be called again to grade
another answer to the same question: that is how the retry agent (`agents/math_retry.py`)
gives the model further tries, like the seeds' single-step math env.

## Reference
`eval_baselines` gives `baseline_most_frequent_answer`: the success of answering every evaluated
question with the most frequent right answer among them.

## Arguments
`dataset_path` (JSONL/Parquet file, or null for synthetic), `question_key`, `answer_key`;
synthetic: `min_operand`, `max_operand` (operand size), `num_ops` (operations per problem),
`ops` (a string of operators among `+`, `-`, `*`, evaluated with the usual precedence);
`correct_reward`, `wrong_reward`, `format_penalty`, `timeout`.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from typing import Any

from agentrl.envs.args import REWARD_MAX, is_number, is_reward
from agentrl.envs.math_grader import shared_grader
from agentrl.envs.table import read_table
from agentrl.envs.text import question_step
from agentrl.errors import ConfigError, shown
from agentrl.registry import register_env

SUFFIXES = (".jsonl", ".json", ".parquet")  # not CSV: its reader infers types (an answer 0.50 would read 0.5)
OPERATORS = "+-*"
OPERAND_MAX = 10**9  # answers stay exact small integers; beyond it a question is mostly digits
NUM_OPS_MAX = 32
TIMEOUT_MAX = 3600.0  # seconds for one grading


def arithmetic_problem(rng: random.Random, min_operand: int, max_operand: int, num_ops: int,
                       ops: str) -> tuple[str, str]:
    """A random problem `What is a + b * c?` and its integer answer (usual precedence)."""
    operands = [rng.randint(min_operand, max_operand) for _ in range(num_ops + 1)]
    operators = [rng.choice(ops) for _ in range(num_ops)]
    text = " ".join(f"{x} {op}" for x, op in zip(operands, operators)) + f" {operands[-1]}"
    return f"What is {text}?", str(evaluate(operands, operators))


def evaluate(operands: list[int], operators: list[str]) -> int:
    """The value of `operands[0] op operands[1] op ...`, multiplication first."""
    terms, signs = [operands[0]], [1]
    for op, x in zip(operators, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


@functools.lru_cache(maxsize=64)
def answer_range(min_operand: int, max_operand: int, num_ops: int, ops: str) -> tuple[int, int]:
    """Smallest and largest answer of these synthetic problems (see MathEnv.answer_range); computed
    once per process: `sample_action` asks for it at every demonstrated reply, 64 times for its entropy."""
    if "*" in ops:
        values = [int(arithmetic_problem(random.Random(k), min_operand, max_operand, num_ops, ops)[1])
                  for k in range(512)]
        return min(values), max(values)
    low = min(min_operand if op == "+" else -max_operand for op in ops)
    high = max(max_operand if op == "+" else -min_operand for op in ops)
    return min_operand + num_ops * low, max_operand + num_ops * high


def load_problems(path: str, question_key: str = "question", answer_key: str = "answer") -> list[tuple[str, str]]:
    """(question, answer) rows of a JSONL, JSON or Parquet file."""
    ds = read_table(path, "math: dataset_path", SUFFIXES)
    for role, key in (("question", question_key), ("answer", answer_key)):
        if key not in ds.column_names:
            raise ConfigError(f"math: dataset {path!r} has no '{key}' column (its columns: "
                              f"{', '.join(ds.column_names)}); set args.{role}_key to the {role} column")
    return [(str(q), str(a)) for q, a in zip(ds[question_key], ds[answer_key])]


class MathEnv:
    """One question per episode; each step grades one answer with math-verify."""

    def __init__(
        self,
        dataset_path: str | None = None,
        question_key: str = "question",
        answer_key: str = "answer",
        min_operand: int = 0,
        max_operand: int = 9,
        num_ops: int = 1,
        ops: str = "+",
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        format_penalty: float = -0.1,
        timeout: float = 5.0,
    ) -> None:
        ints = dict(min_operand=(min_operand, OPERAND_MAX), max_operand=(max_operand, OPERAND_MAX),
                    num_ops=(num_ops, NUM_OPS_MAX))
        for name, (value, most) in ints.items():
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
                raise ConfigError(f"math: {name}={shown(value)} must be an integer from 0 to {most}")
        if max_operand < min_operand or num_ops < 1:
            raise ConfigError(f"math: need min_operand <= max_operand and num_ops >= 1, got "
                              f"{min_operand}..{max_operand}, num_ops={num_ops}")
        if not isinstance(ops, str) or not ops or set(ops) - set(OPERATORS):
            raise ConfigError(f"math: ops={shown(ops)} must be a non-empty string of operators from {OPERATORS!r}")
        for name, amount in dict(correct_reward=correct_reward, wrong_reward=wrong_reward,
                                 format_penalty=format_penalty).items():
            if not is_reward(amount):
                raise ConfigError(f"math: {name}={shown(amount)} must be a number from "
                                  f"-{REWARD_MAX:g} to {REWARD_MAX:g}")
        if not is_number(timeout) or not 0 < timeout <= TIMEOUT_MAX:
            raise ConfigError(f"math: timeout={shown(timeout)} must be a number of seconds > 0, "
                              f"at most {TIMEOUT_MAX:g}")
        self.rows = load_problems(dataset_path, question_key, answer_key) if dataset_path else None
        self.min_operand, self.max_operand, self.num_ops, self.ops = min_operand, max_operand, num_ops, ops
        self.correct_reward, self.wrong_reward = float(correct_reward), float(wrong_reward)
        self.format_penalty, self.timeout = float(format_penalty), float(timeout)
        self.instructions = "Solve the problem. Answer with the final result only, as <answer>result</answer>."
        self._rng = random.Random()
        self.question: str | None = None
        self.answer: str | None = None

    def _problem(self, seed: int) -> tuple[str, str]:
        if self.rows is not None:
            return self.rows[seed % len(self.rows)]
        return arithmetic_problem(random.Random(seed), self.min_operand, self.max_operand, self.num_ops, self.ops)

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Pick the question of `seed` (a random one without a seed)."""
        if seed is None:
            seed = self._rng.randrange(2**31)
        self.question, self.answer = self._problem(seed)
        return self.question, {"question_seed": seed}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Grade `action` as an answer to the current question; always ends the episode."""
        answer, reply, content = question_step("math", self.answer, action)
        grade = await shared_grader().grade(answer, content, self.timeout, expression=content != reply)
        reward = self.correct_reward if grade.correct else (self.wrong_reward if grade.parsed else self.format_penalty)
        info = {"success": grade.correct, "action_valid": grade.parsed,
                "metrics": {"grader_timeout": float(grade.timed_out)}}
        return ("Correct." if grade.correct else "Wrong."), reward, True, False, info

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed reply with a random answer: one of the file's answers, or a uniformly
        random integer in the range the synthetic problems' answers span."""
        if self.rows is not None:
            return f"<answer>{rng.choice(self.rows)[1]}</answer>"
        lo, hi = self.answer_range()
        return f"<answer>{rng.randint(lo, hi)}</answer>"

    def answer_range(self) -> tuple[int, int]:
        """Smallest and largest answer of the synthetic problems (exact for sums and
        differences, sampled over 512 problems when products are involved)."""
        return answer_range(self.min_operand, self.max_operand, self.num_ops, self.ops)

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The most frequent right answer among the evaluated questions, given to every one of them
        (answers compared as written: the file's answers, or the synthetic problems' integers)."""
        answers = [self._problem(t.reset_info["question_seed"])[1] for t in trajectories
                   if "question_seed" in t.reset_info]
        if not answers:
            return {}
        return {"most_frequent_answer": Counter(answers).most_common(1)[0][1] / len(answers)}

    def close(self) -> None:
        """Nothing to release: the grader is shared by every math env and stopped at exit."""


register_env("math", MathEnv)
