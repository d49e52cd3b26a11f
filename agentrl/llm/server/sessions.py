"""Per-episode sessions: an OpenAI chat client's calls recorded token-exact for training.

An agent written against the `openai` client talks to `/sessions/<id>/v1/chat/completions`.
Each call renders the chat template once over the messages it sends. Its prompt must extend
the previous call's prompt plus the reply it chose, id for id: when the messages are the
previous call's, then that reply (as the client was given it), then new messages, the session
takes the previous prompt ids and the reply's sampled ids verbatim and appends the token ids
of what the template adds after the reply (its closing, the new messages, the next generation
prompt), exactly as `Conversation` does. A reply is never decoded and re-encoded into a prompt.
Whatever the client sends is its text, not the template's: the special tokens' text in it is
spelled out as plain text (`render` marks it, `encode_chat` spells it), so it cannot forge a turn.

When that does not hold (the agent rewrote or dropped history, changed its tools, or the
template renders the history differently) the session starts a new *segment*: the prompt is
the template's rendering, tokenised, and the episode trains as one sequence per segment
(`segments` counts the rewrites). The rule is checked by rendering, never assumed.

A session generates through the episode's own LLM client in the event loop that client lives
in (`in_loop`): the HTTP server's handlers run in another thread and never touch an engine of
their own.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.errors import EngineError
from agentrl.llm.conversation import completion_versions
from agentrl.llm.encoding import encode_chat, mark
from agentrl.llm.engine import EPISODE, Completion, LLMClient, SamplingParams
from agentrl.llm.server.chat_messages import normalize_messages, parse_reply, render, same_reply
from agentrl.llm.server.openai_schema import RequestError, RequestSampling, sampling_params
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import TokenRecord

SENTINEL = "\ue000agentrl-reply\ue000"  # a private-use string no template alters: finds a reply's closing


async def in_loop(loop: asyncio.AbstractEventLoop | None, make: Callable[[], Coroutine]) -> Any:
    """Await `make()` in `loop` (the loop an engine lives in), from any thread's loop; a
    cancelled caller cancels it there too."""
    here = asyncio.get_running_loop()
    if loop is None or loop is here:
        return await make()
    if loop.is_closed():
        raise RequestError(410, "this session's episode has ended")
    future = asyncio.run_coroutine_threadsafe(make(), loop)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.cancel()
        raise


class SessionPolicy(Protocol):
    """How a session decodes its k-th call: the run's sampling (training) or the request's."""

    def plan(self, turn: int, prompt_len: int, generated: int, request: RequestSampling) -> list[SamplingParams] | str:
        """One SamplingParams per choice, or why no reply may follow (context, token_budget, max_turns)."""
        ...


@dataclass
class Choice:
    """One reply of a call: the engine's completion and the message the client was given."""

    completion: Completion
    raw: str  # the reply's text (decoded once, for the client)
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str  # stop | length | tool_calls | abort


def make_choice(tokenizer: Tokenizer, completion: Completion, tools: bool) -> Choice:
    """The message a completion becomes: its text without the EOS (and without the stop string,
    as OpenAI does), tool calls parsed when the request gave tools."""
    ids = list(completion.token_ids)
    ended = bool(ids) and ids[-1] == tokenizer.eos_token_id
    raw = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
    text = raw
    if isinstance(completion.stop_reason, str) and completion.stop_reason in text:
        text = text[:text.index(completion.stop_reason)]
    content, calls = parse_reply(text, tools)
    return Choice(completion, raw, content, calls, "tool_calls" if calls else completion.finish_reason)


@dataclass
class Turn:
    """One call: the ids it added before its reply, and its replies (the one continued is `chosen`)."""

    segment: int
    prompt_ids: list[int]
    new_ids: list[int]
    messages: list[dict[str, Any]]
    tools: list[dict] | None
    rendered: str  # the template's text of `messages` with the generation prompt
    choices: list[Choice]
    state: str  # the state the reply acted on: the env's observation, else the last non-assistant message
    chosen: int = 0
    reward: float = 0.0


@dataclass
class Reply:
    """What a call returns to the server: the prompt it ran and its choices."""

    prompt_ids: list[int]
    choices: list[Choice]
    new_segment: bool = False


class Session:
    """One episode's calls, the token record built from them, and its reward."""

    def __init__(self, sid: str, tokenizer: Tokenizer, llm: LLMClient, loop: asyncio.AbstractEventLoop | None,
                 policy: SessionPolicy, episode: object | None = None) -> None:
        self.id = sid
        self.tokenizer = tokenizer
        self.llm = llm
        self.loop = loop
        self.policy = policy
        self.episode = episode  # what EPISODE holds while this session generates
        self.eos_ids = (tokenizer.eos_token_id,)
        self.turns: list[Turn] = []
        self.segments = 0  # segments started after the first (history rewrites)
        self.stop_reason: str | None = None  # why a call got no reply (context, token_budget, max_turns)
        self.posted_reward: float | None = None
        self.engine_error: str | None = None
        self.pending_reward = 0.0  # env rewards before the first reply
        self.observation: str | None = None  # the env's latest observation, when the caller tracks the env
        self.created = time.monotonic()
        self._lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ calls
    async def chat(self, messages: Any, tools: list[dict] | None, request: RequestSampling) -> Reply:
        """Serve one chat call (calls of a session run one at a time, in arrival order)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await self._chat(normalize_messages(messages), tools, request)

    async def _chat(self, messages: list[dict[str, Any]], tools: list[dict] | None, request: RequestSampling) -> Reply:
        rendered = render(self.tokenizer, messages, tools, generation_prompt=True)
        prev = self.turns[-1] if self.turns else None
        bridged = self._bridge(prev, messages, tools, rendered) if prev is not None else None
        if prev is None or bridged is None:
            prompt = encode_chat(self.tokenizer, rendered)
            new_ids, segment = prompt, (prev.segment + 1 if prev is not None else 0)
        else:
            prev.chosen, prompt, new_ids = bridged
            segment = prev.segment
        generated = sum(len(t.choices[t.chosen].completion.token_ids) for t in self.turns)
        plan = self.policy.plan(len(self.turns), len(prompt), generated, request)
        if isinstance(plan, str):  # no room for a reply: an empty one, cut off, and the episode is truncated
            self.stop_reason = plan
            empty = Completion([], [], "length")
            return Reply(prompt, [Choice(empty, "", "", [], "length") for _ in range(request.n)])
        completions = await asyncio.gather(*(self._generate(prompt, sp) for sp in plan))
        choices = [make_choice(self.tokenizer, c, bool(tools)) for c in completions]
        if segment and bridged is None:
            self.segments += 1
        state = self.observation if self.observation is not None else next(
            (m.get("content") or "" for m in reversed(messages) if m["role"] != "assistant"), "")
        self.turns.append(Turn(segment, prompt, new_ids, messages, tools, rendered, choices, state))
        return Reply(prompt, choices, new_segment=bool(segment) and bridged is None)

    async def _generate(self, prompt: list[int], sampling: SamplingParams) -> Completion:
        async def run() -> Completion:
            EPISODE.set(self.episode)  # this task's copy of the context: the episode it generates for
            return await self.llm.generate(prompt, sampling)
        try:
            return await in_loop(self.loop, run)
        except EngineError as e:
            self.engine_error = str(e)
            status = 503 if str(e).startswith(("generation failed", "the engine is closed")) else 400
            raise RequestError(status, f"engine: {e}", code="engine_error") from None

    def _bridge(self, prev: Turn, messages: list[dict], tools: list[dict] | None,
                rendered: str) -> tuple[int, list[int], list[int]] | None:
        """(chosen reply of `prev`, prompt ids, ids added after that reply) when `messages`
        continue `prev` token-exactly; None when a new segment must start."""
        n = len(prev.messages)
        if tools != prev.tools or len(messages) <= n or messages[:n] != prev.messages:
            return None
        sent = messages[n]
        k = next((i for i, c in enumerate(prev.choices) if same_reply(sent, c.content, c.raw, c.tool_calls)), None)
        if k is None:
            return None
        choice = prev.choices[k]
        with_reply = render(self.tokenizer, messages[:n + 1], tools, generation_prompt=False)
        if not with_reply.startswith(prev.rendered) or not rendered.startswith(with_reply):
            return None  # the template rewrites earlier text: not prefix-preserving here
        closing = self._closing(prev, with_reply[len(prev.rendered):], choice)
        if closing is None:
            return None
        ids = choice.completion.token_ids
        if ids and ids[-1] in self.eos_ids:
            eos_text = self.tokenizer.decode(ids[-1:], skip_special_tokens=False)
            if closing.startswith(eos_text):
                closing = closing[len(eos_text):]  # the sampled EOS already closed the turn
        new_ids = encode_chat(self.tokenizer, closing + rendered[len(with_reply):])
        return k, prev.prompt_ids + list(ids) + new_ids, new_ids

    def _closing(self, prev: Turn, body: str, choice: Choice) -> str | None:
        """The template text after the reply in `body` (the reply as rendered, marked, plus its closing)."""
        for text in (choice.raw, choice.content if choice.content and not choice.tool_calls else None):
            if text is not None and body.startswith(text := mark(self.tokenizer, text)):
                return body[len(text):]
        # The template re-formats the reply (tool calls rendered as JSON of its own): find the
        # closing it puts after any assistant message, and the reply is the client's own.
        probe = render(self.tokenizer, prev.messages + [{"role": "assistant", "content": SENTINEL}], prev.tools,
                       generation_prompt=False)
        if not probe.startswith(prev.rendered) or SENTINEL not in probe:
            return None
        closing = probe[probe.index(SENTINEL) + len(SENTINEL):]
        return closing if body.endswith(closing) else None

    def _final_closing(self) -> list[int]:
        """The ids the template puts after the last reply (its end-of-turn text, less the sampled EOS)."""
        last = self.turns[-1]
        choice = last.choices[last.chosen]
        reply = {"role": "assistant", "content": choice.content or ""}
        if choice.tool_calls:
            reply = normalize_messages([{**reply, "tool_calls": choice.tool_calls}])[0]
        try:
            full = render(self.tokenizer, last.messages + [reply], last.tools, generation_prompt=False)
        except ValueError:  # MessageError: a template that cannot render it adds nothing
            return []
        if not full.startswith(last.rendered):
            return []
        closing = self._closing(last, full[len(last.rendered):], choice)
        ids = choice.completion.token_ids
        if closing and ids and ids[-1] in self.eos_ids:
            eos_text = self.tokenizer.decode(ids[-1:], skip_special_tokens=False)
            closing = closing[len(eos_text):] if closing.startswith(eos_text) else closing
        return encode_chat(self.tokenizer, closing) if closing else []

    # ------------------------------------------------------------------ rewards and the record
    def add_env_reward(self, reward: float) -> None:
        """An env step's reward, credited to the latest reply (the action it took)."""
        if self.turns:
            self.turns[-1].reward += float(reward)
        else:
            self.pending_reward += float(reward)

    def records(self, final_reward: float | None = None) -> list[tuple[TokenRecord, list[str], int]]:
        """One (token record, turn states, cut-off replies) per segment. `final_reward` replaces
        the env's step rewards with one reward on the last reply. Each segment's last turn also
        carries the rewards of the segments after it, so every row's return is the episode's
        return from where it starts."""
        rewards = [t.reward for t in self.turns]
        if rewards:
            rewards[0] += self.pending_reward
            if final_reward is not None:
                rewards = [0.0] * (len(rewards) - 1) + [float(final_reward)]
        out: list[tuple[TokenRecord, list[str], int]] = []
        for i, (turn, reward) in enumerate(zip(self.turns, rewards)):
            if i == 0 or turn.segment != self.turns[i - 1].segment:
                out.append((TokenRecord(), [], 0))
            record, states, cut = out[-1]
            chosen = turn.choices[turn.chosen].completion
            record.append_prompt(turn.new_ids)
            record.append_generated(chosen.token_ids, chosen.logprobs, completion_versions(chosen))
            record.set_turn_reward(reward)
            states.append(turn.state)
            out[-1] = (record, states, cut + int(chosen.finish_reason == "length"))
        if out:  # the template's closing after the last reply, as a Conversation ends (mask 0)
            out[-1][0].append_prompt(self._final_closing())
        totals = [sum(record.rewards) for record, _, _ in out]
        for i, (record, _, _) in enumerate(out[:-1]):
            record.rewards[-1] += sum(totals[i + 1:])
        return out


class SessionStore:
    """The live sessions of a server, by unguessable id (thread-safe)."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, tokenizer: Tokenizer, llm: LLMClient, loop: asyncio.AbstractEventLoop | None, policy: SessionPolicy,
             episode: object | None = None) -> Session:
        """A new session generating with `llm` in `loop`."""
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise RequestError(429, f"too many open sessions ({self.max_sessions}); close finished ones")
            sid = secrets.token_urlsafe(16)
            self._sessions[sid] = session = Session(sid, tokenizer, llm, loop, policy, episode)
        return session

    def get(self, sid: str) -> Session:
        """The session `sid`, or a 404."""
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
            raise RequestError(404, "no such session (it ended, or the id is wrong)", code="session_not_found")
        return session

    def close(self, sid: str) -> Session | None:
        """Forget session `sid` (returns it, or None)."""
        with self._lock:
            return self._sessions.pop(sid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


@dataclass(frozen=True)
class RequestPolicy:
    """A served session's decoding: what each request asks (no training run constrains it)."""

    default_max_tokens: int
    eos_ids: tuple[int, ...]

    def plan(self, turn: int, prompt_len: int, generated: int, request: RequestSampling) -> list[SamplingParams] | str:
        """The request's own sampling."""
        return sampling_params(request, self.default_max_tokens, self.eos_ids)
