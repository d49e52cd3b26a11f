"""A generic multi-turn chat agent: observation in as a user message, reply out as the action."""

from __future__ import annotations

from typing import Protocol

from agentrl.envs.base import Env
from agentrl.llm.conversation import Conversation, TokenBudget
from agentrl.llm.engine import LLMClient, SamplingParams
from agentrl.registry import register_agent
from agentrl.trajectory import Task, Trajectory


class ChatAgent:
    """Instructions + first observation as the first user message, each later observation as
    the next user message, until the env terminates or truncates or `max_turns` is reached.

    A reply cut off at `max_new_tokens` (no EOS) is handed to the env as an empty reply, so it
    earns the format penalty: otherwise the policy learns to ramble until the budget runs out.
    When the `budget` leaves no room for another reply (episode token budget spent, or the next
    prompt fills the context) the episode ends as truncated: the last observation, which no
    reply can follow, is taken back out of the sequence, and `truncation_reason` says
    why (`env`, `max_turns`, `context` or `token_budget`).
    """

    def __init__(self, tokenizer, sampling: SamplingParams, max_turns: int,
                 system_prompt: str | None = None, budget: TokenBudget | None = None) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        self.budget = budget or TokenBudget()
        self.eos_token_ids = (tokenizer.eos_token_id,)

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory:
        """Play one episode of `env` seeded by the task."""
        obs, _ = await env.reset(seed=task.env_seed)
        instructions = getattr(env, "instructions", "")  # optional, as close and sample_action are
        conv = start_conversation(self.tokenizer, self.system_prompt, f"{instructions}\n{obs}" if instructions else obs)
        info: dict = {}
        invalid = cut_off = 0
        terminated = truncated = False
        reason: str | None = "max_turns"
        states = []
        observed = None  # mark before the latest observation, taken back if no reply can follow it
        for turn in range(self.max_turns):
            reply, stop = await take_turn(conv, llm, task, turn, self, undo=observed)
            if stop:
                reason = stop
                break
            states.append(obs)
            if reply is None:  # cut off at max_new_tokens: no answer
                cut_off += 1
                reply = ""
            obs, reward, terminated, truncated, step_info = await env.step(reply)
            conv.set_turn_reward(reward)
            invalid += int(not step_info.get("action_valid", True))
            if terminated or truncated:
                info = dict(step_info)
                reason = None if terminated else "env"
                break
            observed = conv.mark()
            conv.add_message("user", obs)
        if self.budget.context:
            conv.trim(self.budget.context)  # a reply that filled the context still gets its closing
        return Trajectory.from_record(conv.record, task, states, success=bool(info.pop("success", False)),
                                      terminated=bool(terminated), truncation_reason=reason, info=info,
                                      invalid_actions=invalid, truncated_replies=cut_off)


def start_conversation(tokenizer, system_prompt: str | None, first_message: str) -> Conversation:
    """A conversation opened by the optional system prompt and the first user message."""
    conv = Conversation(tokenizer)
    if system_prompt:
        conv.add_message("system", system_prompt)
    conv.add_message("user", first_message)
    return conv


class TurnSettings(Protocol):
    """What `take_turn` reads from an agent."""

    sampling: SamplingParams
    budget: TokenBudget
    eos_token_ids: tuple[int, ...]


async def take_turn(conv: Conversation, llm: LLMClient, task: Task, turn: int, agent: TurnSettings,
                    undo: tuple | None = None) -> tuple[str | None, str | None]:
    """Generate and append the next reply within the agent's budget.

    Returns (reply text, None); the text is None when the reply was cut off at its token limit
    (no EOS). When the budget leaves no room for a reply: (None, reason), after taking back what
    was added since the `undo` mark (a message no reply can follow). `agent` supplies
    `sampling`, `budget` and `eos_token_ids`.
    """
    prompt = conv.prompt_ids()
    max_new, stop = agent.budget.allowance(len(prompt), conv.num_generated(), agent.sampling.max_new_tokens)
    if stop:
        if undo is not None:
            conv.rollback(undo)
        return None, stop
    completion = await llm.generate(prompt, turn_sampling(agent.sampling, task, turn, max_new))
    reply = conv.add_completion(completion, agent.eos_token_ids)
    return (reply if completion.finish_reason == "stop" else None), None


def turn_sampling(base: SamplingParams, task: Task, turn: int, max_new_tokens: int | None = None) -> SamplingParams:
    """The sampling of one turn: greedy for eval tasks, seeded by the task and the turn."""
    return SamplingParams(temperature=base.temperature, top_p=base.top_p, top_k=base.top_k,
                          max_new_tokens=base.max_new_tokens if max_new_tokens is None else max_new_tokens,
                          greedy=task.greedy or base.greedy, stop_token_ids=base.stop_token_ids,
                          seed=(task.sampling_seed * 1_000_003 + turn) % (1 << 63))


register_agent("chat", ChatAgent)
