"""A single-turn verifiers environment for agentrl's tests: sums of two digits, an exact-match reward.

Imported only by verifiers' worker (`.venv-verifiers`), as `env.args.load=vf_arith:load_environment`.
"""

import verifiers.v1 as vf
from datasets import Dataset

SYSTEM = "Answer with the number only."


def rows(n: int, start: int) -> Dataset:
    """`n` questions `a + b = ?` with their answers, as an HF dataset: the digit pairs of 7k for k from `start`."""
    items = [(7 * k % 10, 7 * k // 10 % 10) for k in range(start, start + n)]
    return Dataset.from_list([{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in items])


class ArithData(vf.TaskData):
    """One row: the question is the prompt, the answer is scored."""

    answer: str


class ArithTask(vf.Task[ArithData]):
    """Exact match of the reply with the answer (1 or 0), and a small bonus for a short reply."""

    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.strip()) <= 2)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 16
    start: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    """The dataset's rows as tasks."""

    def load(self) -> list[ArithTask]:
        data = rows(self.config.num_tasks, self.config.start)
        return [ArithTask(ArithData(prompt=r["question"], system_prompt=SYSTEM, answer=r["answer"]))
                for r in data]


def load_environment() -> ArithTaskset:
    """The training split."""
    return ArithTaskset(ArithConfig())


def load_eval() -> ArithTaskset:
    """The evaluation split: 4 pairs the training split does not hold."""
    return ArithTaskset(ArithConfig(num_tasks=4, start=50))


__all__ = ["ArithTaskset"]
