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

from agentrl.agents.chat import start_conversation, take_turn
from agentrl.envs.base import Env
from agentrl.llm.conversation import TokenBudget
from agentrl.llm.engine import LLMClient, SamplingParams
from agentrl.registry import register_agent
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import Task, Trajectory

WRONG = "Unfortunately your answer is wrong. Let's try again."  # the seeds' wording
CORRECT = "Congratulations! You are correct!"


class MathRetryAgent:
    """Up to `max_turns` answers to one question, with "wrong, try again" between them."""

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams, max_turns: int,
                 system_prompt: str | None = None, budget: TokenBudget | None = None,
                 turn_discount: float = 1.0, wrong_feedback: str = WRONG) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not 0.0 < turn_discount <= 1.0:
            raise ValueError(f"turn_discount must be in (0, 1], got {turn_discount}")
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        self.budget = budget or TokenBudget()
        self.turn_discount = float(turn_discount)
        self.wrong_feedback = wrong_feedback
        self.eos_token_ids = (tokenizer.eos_token_id,)
        self._feedback: tuple[str, list[int]] | None = None  # (text, ids), tokenised on first use

    @classmethod
    def corpus_texts(cls, args: dict) -> list[str]:
        """Fixed text this agent writes, for training the embedded model's tokenizer."""
        return [args.get("wrong_feedback", WRONG), CORRECT]

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory:
        """Ask the task's question until it is answered right or the tries run out."""
        question, _ = await env.reset(seed=task.env_seed)
        conv = start_conversation(self.tokenizer, self.system_prompt, f"{env.instructions}\n{question}")
        solved_at: int | None = None
        reason: str | None = "max_turns"
        invalid = cut_off = 0
        states, replies, fed_back, env_metrics = [], [], None, []
        for turn in range(self.max_turns):
            reply, stop = await take_turn(conv, llm, task, turn, self, undo=fed_back)
            if stop:
                reason = stop
                break
            states.append("\n".join([question, *replies]))  # the question and the tries so far
            if reply is None:  # cut off at max_new_tokens: no answer
                cut_off += 1
                reply = ""
            replies.append(reply)
            _, reward, _, _, step_info = await env.step(reply)
            env_metrics.append(step_info.get("metrics") or {})
            conv.set_turn_reward(reward * self.turn_discount ** turn)
            invalid += int(not step_info.get("action_valid", True))
            if step_info.get("success"):
                solved_at, reason = turn, None
                break
            if turn + 1 < self.max_turns:
                fed_back = conv.mark()
                if self._feedback is None:
                    self._feedback = conv.prepare("user", self.wrong_feedback)
                conv.add_prepared("user", self.wrong_feedback, self._feedback)
        if self.budget.context:
            conv.trim(self.budget.context)  # a reply that filled the context still gets its closing
        metrics = {**_mean_per_key(env_metrics), **{f"success_at_{k}": float(solved_at is not None and solved_at < k)
                                                    for k in range(1, self.max_turns + 1)}}
        return Trajectory.from_record(conv.record, task, states, success=solved_at is not None,
                                      terminated=solved_at is not None, truncation_reason=reason,
                                      info={"metrics": metrics}, invalid_actions=invalid, truncated_replies=cut_off)


def _mean_per_key(rows: list[dict]) -> dict[str, float]:
    """The env's numeric per-step metrics, averaged over the tries (e.g. grader_timeout)."""
    keys = {k for row in rows for k, v in row.items() if isinstance(v, (int, float))}
    return {k: sum(float(r[k]) for r in rows if k in r) / sum(1 for r in rows if k in r) for k in keys}


register_agent("math_retry", MathRetryAgent)
