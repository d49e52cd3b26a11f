"""A generic multi-turn chat agent: observation in as a user message, reply out as the action."""

from __future__ import annotations

from typing import Protocol

from agentrl.envs.base import Env
from agentrl.errors import ConfigError
from agentrl.llm.conversation import Conversation, TokenBudget
from agentrl.llm.engine import LLMClient, SamplingParams
from agentrl.registry import register_agent
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import Task, TokenRecord, Trajectory


class ChatAgent:
    """Instructions + first observation as the first user message, each later observation as
    the next user message, until the env terminates or truncates or `max_turns` is reached.

    `history_length` (verl-agent's name) bounds what each prompt holds: with k, a turn's prompt
    is the instructions, the last k turns (observation and reply) and the current observation,
    and every turn trains as its own sequence (a segment of the episode, whose reward is the
    episode's return from that turn on); None keeps the whole episode in one sequence. A Markov
    env (a board that shows all there is) needs no history, and a short prompt is one a small
    policy reads easily and a long episode still fits in.

    A reply cut off at `max_new_tokens` (no EOS) is handed to the env as an empty reply, so it
    earns the format penalty: otherwise the policy learns to ramble until the budget runs out.
    When the `budget` leaves no room for another reply (episode token budget spent, or the next
    prompt fills the context) the episode ends as truncated: the last observation, which no
    reply can follow, is taken back out of the sequence, and `truncation_reason` says
    why (`env`, `max_turns`, `context` or `token_budget`).
    """

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams, max_turns: int,
                 system_prompt: str | None = None, budget: TokenBudget | None = None,
                 history_length: int | None = None) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if history_length is not None and (isinstance(history_length, bool) or not isinstance(history_length, int)
                                           or history_length < 0):
            raise ConfigError(f"agent.args.history_length={history_length!r}: expected an int >= 0 (turns kept "
                              "in each prompt), or null for the whole episode in one sequence")
        self.history_length = history_length
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
        if self.history_length is not None:
            return await self._run_windowed(task, env, llm, instructions, obs)
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

    async def _run_windowed(self, task: Task, env: Env, llm: LLMClient, instructions: str,
                            obs: str) -> Trajectory | list[Trajectory]:
        """The episode as one sequence per turn, each prompt holding the last `history_length` turns."""
        past: list[tuple[str, list[int]]] = []  # (observation, reply ids) of each turn played
        turns: list[tuple[TokenRecord, str, int]] = []  # (record, observation, cut off?) per turn
        rewards: list[float] = []
        info: dict = {}
        invalid = generated = 0
        terminated = False
        reason: str | None = "max_turns"
        for turn in range(self.max_turns):
            window = past[len(past) - self.history_length:] if self.history_length else []
            conv = self._window(instructions, window, obs)
            reply, stop = await take_turn(conv, llm, task, turn, self, generated=generated)
            if stop:
                reason = stop
                if not turns:  # no room for a first reply: the prompt alone, as ChatAgent's
                    turns.append((conv.record, obs, 0))
                break
            if self.budget.context:
                conv.trim(self.budget.context)  # a reply that filled the context still gets its closing
            ids = [i for i, m in zip(conv.token_ids, conv.loss_mask) if m]
            generated += len(ids)
            turns.append((conv.record, obs, int(reply is None)))
            past.append((obs, ids))
            obs, reward, terminated, truncated, step_info = await env.step(reply or "")
            rewards.append(float(reward))
            invalid += int(not step_info.get("action_valid", True))
            if terminated or truncated:
                info = dict(step_info)
                reason = None if terminated else "env"
                break
        success = bool(info.pop("success", False))
        out = []
        for k, (record, state, cut) in enumerate(turns):
            if record.rewards:
                record.set_rewards([sum(rewards[k:])])  # the return from this turn on (as sessions.records)
            out.append(Trajectory.from_record(record, task, [state] if record.rewards else [], success=success,
                                              terminated=bool(terminated), truncation_reason=reason, info=dict(info),
                                              invalid_actions=invalid if k == 0 else 0, truncated_replies=cut,
                                              segment=k))
        return out[0] if len(out) == 1 else out

    def _window(self, instructions: str, window: list[tuple[str, list[int]]], obs: str) -> Conversation:
        """A turn's prompt: the instructions, the window's turns (their replies' ids verbatim), `obs`."""
        first = window[0][0] if window else obs
        opening = f"{instructions}\n{first}" if instructions else first
        conv = start_conversation(self.tokenizer, self.system_prompt, opening)
        for k, (_, ids) in enumerate(window):
            conv.add_past_reply(ids, self.eos_token_ids)
            conv.add_message("user", window[k + 1][0] if k + 1 < len(window) else obs)
        return conv


def start_conversation(tokenizer: Tokenizer, system_prompt: str | None, first_message: str,
                       tools: list[dict] | None = None) -> Conversation:
    """A conversation opened by the optional system prompt and the first user message (with the
    `tools` the template renders, if any)."""
    conv = Conversation(tokenizer, tools=tools)
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
                    undo: tuple | None = None, generated: int = 0) -> tuple[str | None, str | None]:
    """Generate and append the next reply within the agent's budget.

    Returns (reply text, None); the text is None when the reply was cut off at its token limit
    (no EOS). When the budget leaves no room for a reply: (None, reason), after taking back what
    was added since the `undo` mark (a message no reply can follow). `agent` supplies
    `sampling`, `budget` and `eos_token_ids`; `generated` counts the episode's ids generated in
    its earlier sequences.
    """
    prompt = conv.prompt_ids()
    max_new, stop = agent.budget.allowance(len(prompt), generated + conv.num_generated(),
                                           agent.sampling.max_new_tokens)
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
