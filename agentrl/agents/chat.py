"""A generic multi-turn chat agent: observation in as a user message, reply out as the action."""

from __future__ import annotations

from typing import Any

from agentrl.agents.game import play_episode
from agentrl.agents.loop import Episode, TurnAgent, check_max_turns, start_conversation
from agentrl.envs.base import Env
from agentrl.errors import ConfigError
from agentrl.llm.conversation import Conversation, TokenBudget
from agentrl.llm.engine import LLMClient, SamplingParams
from agentrl.registry import register_agent
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import Task, TokenRecord, Trajectory


class ChatAgent(TurnAgent):
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

    plays_games = True  # a game's roles each get a seat (agents/game.py)

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams, max_turns: int,
                 system_prompt: str | None = None, budget: TokenBudget | None = None,
                 history_length: int | None = None) -> None:
        check_max_turns(max_turns)
        if history_length is not None and (isinstance(history_length, bool) or not isinstance(history_length, int)
                                           or history_length < 0):
            raise ConfigError(f"agent.args.history_length={history_length!r}: expected an int >= 0 (turns kept "
                              "in each prompt), or null for the whole episode in one sequence")
        super().__init__(tokenizer, sampling, max_turns, system_prompt, budget)
        self.history_length = history_length

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory | list[Trajectory]:
        """Play one episode of `env` seeded by the task (a game: one trajectory per role, agents/game.py)."""
        episode = Episode if self.history_length is None else WindowedEpisode
        return await play_episode(self, episode, task, env, llm)


class WindowedEpisode(Episode):
    """The conversation policy of `history_length`: one sequence per turn, each prompt holding the
    instructions, the last `history_length` turns and the current observation."""

    agent: ChatAgent

    def __init__(self, agent: ChatAgent, task: Task, env: Env, llm: LLMClient, obs: Any) -> None:
        self.instructions = getattr(env, "instructions", "")
        self.past: list[tuple[str, list[int]]] = []  # (observation, reply ids) of each turn played
        self.segments: list[tuple[TokenRecord, str, int]] = []  # (record, observation, cut off?) per turn
        super().__init__(agent, task, env, llm, obs)

    def open(self) -> Conversation:
        return self._window()

    def prompt(self) -> Conversation:
        if self.replies:  # a new sequence per turn (the first is the opening)
            self.conv = self._window()
        return self.conv

    def replied(self, reply: str | None) -> None:
        if self.agent.budget.context:
            self.conv.trim(self.agent.budget.context)  # a reply that filled the context still gets its closing
        ids = [i for i, m in zip(self.conv.token_ids, self.conv.loss_mask) if m]
        self.generated += len(ids)
        self.segments.append((self.conv.record, self.obs, int(reply is None)))
        self.past.append((self.obs, ids))

    def stopped(self) -> None:
        if not self.segments:  # no room for a first reply: the prompt alone, as the whole episode's
            self.segments.append((self.conv.record, self.obs, 0))

    def tell(self, obs: Any) -> None:
        self.state = obs  # the next turn's prompt shows it (`prompt`)

    def finish(self) -> Trajectory | list[Trajectory]:
        """One trajectory per turn (a segment), whose reward is the episode's return from that turn on."""
        rewards = [record.rewards[-1] for record, _, _ in self.segments if record.rewards]
        out = []
        for k, (record, state, cut) in enumerate(self.segments):
            if record.rewards:
                record.set_rewards([sum(rewards[k:])])  # the return from this turn on (as sessions.records)
            out.append(Trajectory.from_record(record, self.task, [state] if record.rewards else [],
                                              success=self.success, terminated=self.terminated,
                                              truncation_reason=self.reason, info=dict(self.info),
                                              invalid_actions=self.invalid if k == 0 else 0, truncated_replies=cut,
                                              segment=k))
        return out[0] if len(out) == 1 else out

    def _window(self) -> Conversation:
        """A turn's prompt: the instructions, the window's turns (their replies' ids verbatim), the observation."""
        k = self.agent.history_length
        window = self.past[len(self.past) - k:] if k else []
        first = window[0][0] if window else self.obs
        opening = f"{self.instructions}\n{first}" if self.instructions else first
        conv = start_conversation(self.agent.tokenizer, self.agent.system_prompt, opening)
        for j, (_, ids) in enumerate(window):
            conv.add_past_reply(ids, self.agent.eos_token_ids)
            conv.add_message("user", window[j + 1][0] if j + 1 < len(window) else self.obs)
        return conv


register_agent("chat", ChatAgent)
