"""The seeds' multi-turn math agent: answer, hear "wrong, try again", answer again.

AReaL's `MathMultiTurnAgent`, on our agent contract. The question opens the conversation; the
model answers; the env grades the answer. A right answer ends the episode; a wrong one is
followed by the fixed feedback message, appended as ids tokenised once per agent (mask 0),
and the model tries again, up to `max_turns` answers. Every generated id is kept verbatim
(mask 1) by `Conversation`.

Differences from AReaL, on purpose:
1. The episode stops at the first right answer (AReaL plays every turn, congratulating the
   model and asking again), so "success within k turns" is well defined.
2. Turn k's reward is the env's reward times `turn_discount ** k`: a right answer on the first
   try is worth more than one on the third. AReaL maps success to +-1 per turn and sums the
   returns back with its `turn_level_discount`; here returns are the algorithm's job
   (`algorithm.credit=turn`, `algorithm.gamma`), so the agent only discounts rewards.
3. One growing sequence per episode (AReaL emits one sequence per turn).

`info["metrics"]["success_at_k"]` (k = 1..max_turns) is 1 when a right answer came within k
tries: averaged over episodes it is the success within k turns, rising with k. The env's own
per-step metrics (the math env's `grader_timeout`) are averaged over the tries.
"""

from __future__ import annotations

from typing import Any

from agentrl.agents.loop import Episode, TurnAgent, check_max_turns, start_conversation
from agentrl.envs.base import Env
from agentrl.llm.conversation import Conversation, TokenBudget
from agentrl.llm.engine import LLMClient, SamplingParams
from agentrl.registry import register_agent
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import Task, Trajectory

WRONG = "Unfortunately your answer is wrong. Let's try again."  # the seeds' wording
CORRECT = "Congratulations! You are correct!"


class MathRetryAgent(TurnAgent):
    """Up to `max_turns` answers to one question, with "wrong, try again" between them."""

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams, max_turns: int,
                 system_prompt: str | None = None, budget: TokenBudget | None = None,
                 turn_discount: float = 1.0, wrong_feedback: str = WRONG) -> None:
        check_max_turns(max_turns)
        if not 0.0 < turn_discount <= 1.0:
            raise ValueError(f"turn_discount must be in (0, 1], got {turn_discount}")
        super().__init__(tokenizer, sampling, max_turns, system_prompt, budget)
        self.turn_discount = float(turn_discount)
        self.wrong_feedback = wrong_feedback
        self._feedback: tuple[str, list[int]] | None = None  # (text, ids), tokenised on first use

    @classmethod
    def corpus_texts(cls, args: dict) -> list[str]:
        """Fixed text this agent writes, for training the embedded model's tokenizer."""
        return [args.get("wrong_feedback", WRONG), CORRECT]

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory | list[Trajectory]:
        """Ask the task's question until it is answered right or the tries run out."""
        question, _ = await env.reset(seed=task.env_seed)
        return await RetryEpisode(self, task, env, llm, question).play()

    def feedback(self, conv: Conversation) -> tuple[str, list[int]]:
        """The wrong-answer feedback's (text, ids) after `conv`, tokenised once per agent."""
        if self._feedback is None:
            self._feedback = conv.prepare("user", self.wrong_feedback)
        return self._feedback


class RetryEpisode(Episode):
    """The retry agent's hooks: a step ends the episode on a right answer only, a wrong one is
    answered with the feedback, rewards are discounted by the try, states are the tries so far."""

    agent: MathRetryAgent

    def __init__(self, agent: MathRetryAgent, task: Task, env: Env, llm: LLMClient, question: str) -> None:
        self.question = question
        self.tries: list[str] = []  # the replies so far ("" for one cut off)
        self.env_metrics: list[dict] = []  # the env's metrics of each try
        self.solved_at: int | None = None  # the try that was right
        super().__init__(agent, task, env, llm, question)

    def open(self) -> Conversation:
        return start_conversation(self.agent.tokenizer, self.agent.system_prompt,
                                  f"{self.env.instructions}\n{self.question}")

    def replied(self, reply: str | None) -> None:
        self.tries.append(reply or "")
        self.state = "\n".join([self.question, *self.tries])  # the question and the tries so far

    def shaped_reward(self, reward: float) -> float:
        return reward * self.agent.turn_discount ** self.steps

    def ends(self, terminated: bool, truncated: bool, info: dict) -> bool:
        """A right answer ends the episode; the env's own end does not (the question stays)."""
        self.env_metrics.append(info.get("metrics") or {})
        if not info.get("success"):
            return False
        self.solved_at, self.reason = self.steps - 1, None
        self.success = self.terminated = True
        return True

    def tell(self, obs: Any) -> None:
        if self.steps < self.agent.max_turns:  # another try follows: the feedback
            self.undo = self.conv.mark()
            self.conv.add_prepared("user", self.agent.wrong_feedback, self.agent.feedback(self.conv))

    def closing_info(self) -> dict:
        solved_at, turns = self.solved_at, self.agent.max_turns
        return {"metrics": {**_mean_per_key(self.env_metrics),
                            **{f"success_at_{k}": float(solved_at is not None and solved_at < k)
                               for k in range(1, turns + 1)}}}


def _mean_per_key(rows: list[dict]) -> dict[str, float]:
    """The env's numeric per-step metrics, averaged over the tries (e.g. grader_timeout)."""
    keys = {k for row in rows for k, v in row.items() if isinstance(v, (int, float))}
    return {k: sum(float(r[k]) for r in rows if k in r) / sum(1 for r in rows if k in r) for k in keys}


register_agent("math_retry", MathRetryAgent)
