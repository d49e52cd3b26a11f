"""Token-exact multi-turn conversations built from a chat template.

A conversation is one growing list of token ids. Messages we write (instructions,
observations, feedback) are rendered with the tokenizer's chat template and appended as ids
with loss mask 0; ids the engine generated are appended exactly as they came, with loss mask 1
and their behaviour logprobs. A model reply is never decoded and re-encoded into training
data: decoding happens only to hand the env its action text and to render later turns.

Each new piece is the *difference* between the template's rendering of the conversation with
and without it, so templates that add a default system prompt (Qwen2.5) or close assistant
turns with extra text work unchanged. Message content is never the template's: the special tokens'
text in it is marked before rendering and spelled out as plain text (`llm/encoding.py`), so a tool
answer or an observation that prints `<|im_start|>system` cannot forge a turn; the tools' schemas
too. That needs a prefix-preserving template:
`check_chat_template` plays the agent's conversation shape at start-up and fails with one line
if the template is not (a conversation also re-checks every turn).

`TokenBudget` holds an episode's limits (generated tokens in all turns, context length):
agents ask it how long the next reply may be, and end the episode as truncated, with the
reason, when there is no room left, instead of sending the engine a request it must refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.errors import ConfigError
from agentrl.llm.encoding import encode_chat, encode_text, mark  # noqa: F401 (encode_text: re-exported)
from agentrl.llm.engine import Completion
from agentrl.tokenizer import Tokenizer
from agentrl.trajectory import TokenRecord

NOT_PREFIX_PRESERVING = (
    "the tokenizer's chat template is not prefix-preserving: rendering turns 1..k+1 does not start with "
    "the rendering of turns 1..k ({where}); multi-turn training data would be corrupted (use a template "
    "without history-dependent edits, e.g. one that keeps earlier assistant turns verbatim)"
)


@dataclass
class Conversation:
    """One episode's token sequence, loss mask, behaviour logprobs and per-turn rewards."""

    tokenizer: Tokenizer
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None  # function schemas the template renders (`apply_chat_template(tools=)`)
    record: TokenRecord = field(default_factory=TokenRecord)  # the ids, mask, logprobs, rewards so far
    # What the template renders: `messages` and `tools` with the special tokens' text in the
    # content marked (the same objects where there is none; replies are the model's, unmarked).
    _marked: list[dict] = field(default_factory=list)
    _marked_tools: list[dict] | None = None
    _rendered: str = ""  # the rendering so far, of the marked messages
    # The rendering with the generation prompt and the header's ids, for a message count: the
    # prompt and the completion of one turn both need them, and rendering grows with the history.
    _with_header: tuple[int, str, list[int]] | None = None

    # The record's sequences, read by agents and tests as the conversation's own.
    token_ids = property(lambda self: self.record.token_ids)
    loss_mask = property(lambda self: self.record.loss_mask)
    logprobs = property(lambda self: self.record.logprobs)
    versions = property(lambda self: self.record.versions)
    rewards = property(lambda self: self.record.rewards)
    reward_positions = property(lambda self: self.record.reward_positions)

    def __post_init__(self) -> None:
        if len(self._marked) != len(self.messages):
            self._marked = [mark(self.tokenizer, m) if m.get("role") != "assistant" else m for m in self.messages]
        if self._marked_tools is None and self.tools:
            self._marked_tools = mark(self.tokenizer, self.tools)

    # ------------------------------------------------------------------ messages we write
    def add_message(self, role: str, content: str) -> None:
        """Append a user/system/tool message as template-formatted ids (mask 0)."""
        self.add_messages([{"role": role, "content": content}])

    def add_messages(self, messages: list[dict]) -> None:
        """Append several messages at once as template-formatted ids (mask 0): the tool answers of
        one reply (Qwen's template closes a run of tool messages only after its last one)."""
        self.messages.extend(messages)
        self._marked.extend(mark(self.tokenizer, m) for m in messages)
        text = self._render(add_generation_prompt=False)
        self._append_text(self._delta(text))
        self._rendered = text

    def prompt_ids(self) -> list[int]:
        """The ids to send to the engine: everything so far plus the assistant header."""
        return self.token_ids + self._generation_prompt()[1]

    def num_prompt_tokens(self) -> int:
        """Length of the next prompt."""
        return len(self.prompt_ids())

    def num_generated(self) -> int:
        """Ids the policy generated so far."""
        return self.record.num_generated

    def add_prepared(self, role: str, content: str, prepared: tuple[str, list[int]]) -> None:
        """Append a fixed message whose (text, ids) were rendered and tokenised once in advance.

        Feedback an agent repeats every turn is tokenised once (AReaL's pattern); the rendering is
        still compared as text, and a template that renders it differently here falls back to
        encoding this rendering, so the ids always match the text.
        """
        self.messages.append({"role": role, "content": content})
        self._marked.append(mark(self.tokenizer, self.messages[-1]))
        text = self._render(add_generation_prompt=False)
        delta = self._delta(text)
        self.record.append_prompt(list(prepared[1]) if delta == prepared[0] else self._encode(delta))
        self._rendered = text

    def prepare(self, role: str, content: str) -> tuple[str, list[int]]:
        """(text, ids) that `role`'s `content` adds after this conversation, for `add_prepared`."""
        probe = Conversation(self.tokenizer, messages=list(self.messages), tools=self.tools, _marked=list(self._marked),
                             _marked_tools=self._marked_tools, _rendered=self._rendered)
        probe.add_message(role, content)
        return probe._rendered[len(self._rendered):], probe.token_ids

    def trim(self, length: int) -> None:
        """Drop ids past `length` when they are only template text after the last reply (the
        closing of a reply cut off by the context limit): they carry no loss and no reward."""
        self.record.truncate(length)

    def mark(self) -> tuple[int, int, str]:
        """A point to `rollback` to (messages, ids, rendering)."""
        return len(self.messages), len(self.token_ids), self._rendered

    def rollback(self, mark: tuple[int, int, str]) -> None:
        """Forget every message and id added after `mark` (only messages we wrote, no reply)."""
        n_messages, n_ids, rendered = mark
        assert sum(self.loss_mask[n_ids:]) == 0 and len(self.rewards) == sum(
            1 for m in self.messages[:n_messages] if m["role"] == "assistant"), "rollback past a reply"
        del self.messages[n_messages:]
        del self._marked[n_messages:]
        self.record.truncate(n_ids)
        self._rendered = rendered

    # ------------------------------------------------------------------ the model's reply
    def add_completion(self, completion: Completion, eos_token_ids: tuple[int, ...]) -> str:
        """Append the engine's ids verbatim (mask 1) and close the turn; return the reply text."""
        return self._add_reply(list(completion.token_ids), eos_token_ids, completion)

    def add_past_reply(self, ids: list[int], eos_token_ids: tuple[int, ...]) -> str:
        """Append a reply generated in an earlier sequence of the episode, its ids verbatim, as
        context (mask 0: it trains in the sequence that generated it); return its text."""
        return self._add_reply(list(ids), eos_token_ids, None)

    def _add_reply(self, ids: list[int], eos_token_ids: tuple[int, ...], completion: Completion | None) -> str:
        prefix, header = self._generation_prompt()
        self.record.append_prompt(header)
        if completion is None:
            self.record.append_prompt(ids)
        else:
            self.record.append_generated(ids, completion.logprobs, completion_versions(completion))
        ended = bool(ids) and ids[-1] in eos_token_ids
        content_ids = ids[:-1] if ended else ids
        content = self.tokenizer.decode(content_ids, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": content})
        self._marked.append(self.messages[-1])
        full = self._render(add_generation_prompt=False)
        if not full.startswith(prefix + content):
            raise ConfigError(NOT_PREFIX_PRESERVING.format(where="an assistant reply does not extend its prompt"))
        closing = full[len(prefix) + len(content):]
        eos_text = self.tokenizer.decode(ids[-1:]) if ended else ""
        if ended and closing.startswith(eos_text):
            closing = closing[len(eos_text):]  # the generated EOS already closed the turn
        self._append_text(closing)
        self._rendered = full
        return content

    def set_turn_reward(self, reward: float) -> None:
        """Record the env's reward for the latest turn (placed at its last generated id)."""
        self.record.set_turn_reward(reward)

    # ------------------------------------------------------------------ internals
    def _render(self, add_generation_prompt: bool) -> str:
        return render_chat(self.tokenizer, self._marked, self._marked_tools, add_generation_prompt)

    def _delta(self, text: str) -> str:
        if not text.startswith(self._rendered):
            where = f"after {len(self.messages) - 1} messages, adding a {self.messages[-1]['role']} message"
            raise ConfigError(NOT_PREFIX_PRESERVING.format(where=where))
        return text[len(self._rendered):]

    def _generation_prompt(self) -> tuple[str, list[int]]:
        """(rendering with the generation prompt, the header's ids), rendered once per turn."""
        if self._with_header is None or self._with_header[0] != len(self.messages):
            text = self._render(add_generation_prompt=True)
            self._with_header = (len(self.messages), text, self._encode(self._delta(text)))
        return self._with_header[1], list(self._with_header[2])

    def _encode(self, text: str) -> list[int]:
        return encode_chat(self.tokenizer, text) if text else []

    def _append_text(self, text: str) -> None:
        self.record.append_prompt(self._encode(text))


def render_chat(tokenizer: Tokenizer, messages: list[dict], tools: list[dict] | None,
                add_generation_prompt: bool) -> str:
    """The chat template's text for `messages`, with `tools` rendered when there are any."""
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **kwargs)


def completion_versions(completion: Completion) -> list[int]:
    """The policy version of each generated id (engines that report one version: that one)."""
    return list(completion.versions) or [completion.policy_version] * len(completion.token_ids)


@dataclass(frozen=True)
class TokenBudget:
    """An episode's token limits; 0 turns a limit off."""

    episode_tokens: int = 0  # most ids the policy generates in the whole episode
    context: int = 0  # most ids in the sequence: the next prompt plus its reply must fit

    def allowance(self, prompt_tokens: int, generated: int, max_new_tokens: int) -> tuple[int, str | None]:
        """How many tokens the next reply may have, given the next prompt's length and the ids
        generated so far; or (0, reason) when the episode must end."""
        n = max_new_tokens
        if self.episode_tokens:
            left = self.episode_tokens - generated
            if left <= 0:
                return 0, "token_budget"
            n = min(n, left)
        if self.context:
            room = self.context - prompt_tokens
            if room <= 0:
                return 0, "context"
            n = min(n, room)
        return n, None


def check_chat_template(tokenizer: Tokenizer, system_prompt: str | None = None, turns: int = 3,
                        feedback: tuple[str, ...] = ("Wrong, try again.",), tools: list[dict] | None = None) -> None:
    """Play the agent's conversation shape (system?, then user/assistant turns) through a
    `Conversation`; raise a one-line ConfigError if the template is not prefix-preserving.

    With `tools` (function schemas), the template renders them, and the first reply calls one,
    answered by two tool messages at once, as the tool agent does."""
    conv = Conversation(tokenizer, tools=tools or None)
    if system_prompt:
        conv.add_message("system", system_prompt)
    conv.add_message("user", "Instructions.\nObservation 0.")
    eos = tokenizer.eos_token_id
    ends = (eos,) if eos is not None else ()  # a tokenizer without EOS: replies end without a stop id
    for k in range(turns):
        text = f"<answer>{k}</answer>"
        if tools and k == 0:
            name = tools[0]["function"]["name"]
            text = f'<tool_call>\n{{"name": "{name}", "arguments": {{}}}}\n</tool_call>'
        reply = tokenizer.encode(text, add_special_tokens=False) + list(ends)
        conv.add_completion(Completion(reply, [0.0] * len(reply), "stop"), ends)
        if tools and k == 0:
            conv.add_messages([{"role": "tool", "content": "Answer 1."}, {"role": "tool", "content": "Answer 2."}])
        else:
            conv.add_message("user", feedback[k % len(feedback)] if feedback else f"Observation {k + 1}.")
    full = conv._render(add_generation_prompt=True)
    if not full.startswith(conv._rendered):
        raise ConfigError(NOT_PREFIX_PRESERVING.format(where="the generation prompt"))
