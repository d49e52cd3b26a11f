"""The tool agent: the chat agent, with tools the model calls in its own format between env steps.

The chat template renders the tools' schemas (`apply_chat_template(tools=...)`). A reply that
holds `<tool_call>` blocks (Qwen's / Hermes' format, parsed by `llm/tool_calls.py`) is not an
action: its calls run (at once, each under `tool_timeout` seconds) and their answers come back as
the template's tool messages, all of one reply's at once; the model replies again. A reply
without a call is the action the env steps on. So an episode of `max_turns` env steps may hold
up to `max_tool_calls` more replies; once the calls are spent, a reply that calls anyway goes to
the env as its action (which cannot parse it). The calls of one reply past the episode's
`max_tool_calls` are not run: one answer says so, for all of them (a reply of a thousand calls
adds the answers of `max_tool_calls` + 1).

Token-exact as every agent: replies are the engine's ids verbatim (mask 1); tool answers are
observations we write (mask 0). A malformed call (not JSON, no name, an unknown tool, wrong
arguments, never closed) is answered with an error saying what is wrong, as is a tool that
fails or times out; an answer longer than `max_tool_response_length` characters is cut
(`tool_response_truncate_side`, verl's names and marks).

Each tool reply is a turn of its own with reward 0 (the env's rewards sit on the replies it
stepped on); its state, for step-level credit, is the observation and the tool answers so far.
`info["metrics"]` gets `tools/calls`, `tools/malformed`, `tools/errors` (failed calls, timeouts
included), `tools/timeouts` and `tools/used` (0 or 1) per episode, and `tools/success_with_tool`
or `tools/success_without_tool` (the episode's success, under the one that applies): averaged
per tag they are the rates the logs show as `env/<tag>/tools/...` and `eval/<tag>/tools/...`.
With no tools (`tools: []`) the agent is the chat agent: the same model and recipe, tools off.
`mcp_servers` adds the tools of MCP servers (agentrl/tools/mcp.py), run and counted as ours.

A task that cannot be solved without its tools says so: the env with a `needs_tools = True`
attribute, or the config with `agent.args.needs_tools=true` (which overrides the env's). The
agent then marks its episodes `info["needs_tools"] = True`, when it offers tools (the no-tool
baseline is never marked), and the `reward_without_tools` alarm (agentrl/health.py) watches them.
For the viewer, `info["tool_spans"]` lists `[start, end, kind, name]` per call and per answer:
the ids of each `<tool_call>` block of a reply (kind `call`, the name it called or `malformed`;
those past `max_tool_calls` together, `not run`) and of the tool messages answering them (kind
`answer`, the names answered, comma-separated).
"""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import Sequence
from typing import Any

from agentrl.agents.game import play_episode
from agentrl.agents.loop import Episode, TurnAgent, check_max_turns, start_conversation
from agentrl.envs.base import Env
from agentrl.errors import ConfigError, did_you_mean
from agentrl.llm.conversation import Conversation, TokenBudget, check_chat_template
from agentrl.llm.engine import LLMClient, SamplingParams
from agentrl.llm.tool_calls import OPEN, ToolCall, call_text, parse_tool_calls
from agentrl.registry import TOOLS, register_agent
from agentrl.tokenizer import Tokenizer
from agentrl.tools import Tool
from agentrl.tools.tool import ToolUsage, answer_call, checking_only
from agentrl.trajectory import Task, Trajectory

TRUNCATE_SIDES = ("left", "right", "middle")
NOT_RUN = "not run"  # the span name of the calls past max_tool_calls (answered together, not run)


class ToolAgent(TurnAgent):
    """The chat agent with tools (see the module's docstring)."""

    plays_games = True  # a game's roles each get a seat (agents/game.py), with tools between its turns

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams, max_turns: int,
                 system_prompt: str | None = None, budget: TokenBudget | None = None,
                 tools: Sequence[str] = (), tool_args: dict[str, dict] | None = None, max_tool_calls: int = 4,
                 tool_timeout: float = 30.0, max_tool_response_length: int = 1024,
                 tool_response_truncate_side: str = "left", needs_tools: bool | None = None,
                 mcp_servers: list[dict] | None = None) -> None:
        # Arguments are rejected with ValueError, as every agent's (the run names the config key), before
        # any other work (a bad tool setting is refused before the tokenizer is touched).
        check_max_turns(max_turns)
        check_int("max_tool_calls", max_tool_calls, 0)
        check_int("max_tool_response_length", max_tool_response_length, 1)
        if tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"tool_response_truncate_side={tool_response_truncate_side!r}; expected one of "
                             f"{', '.join(TRUNCATE_SIDES)}")
        self.tools = offer_tools(tools, tool_args, tool_timeout, needs_tools, mcp_servers)
        super().__init__(tokenizer, sampling, max_turns, system_prompt, budget)
        self.max_tool_calls = max_tool_calls
        self.tool_timeout = float(tool_timeout)
        self.max_tool_response_length = max_tool_response_length
        self.truncate_side = tool_response_truncate_side
        self.needs_tools = needs_tools
        self.schemas = [t.schema for t in self.tools.values()] or None
        if self.schemas and callable(getattr(tokenizer, "apply_chat_template", None)):
            check_chat_template(tokenizer, system_prompt, tools=self.schemas)

    @classmethod
    def corpus_texts(cls, args: dict) -> list[str]:
        """Fixed text this agent writes, for training the embedded model's tokenizer: the tools'
        schemas (its MCP servers' too, which are started for it), and a call of each."""
        tools = resolve_tools(args.get("tools", ()), args.get("tool_args"))
        if args.get("mcp_servers") and not checking_only():
            from agentrl.tools.mcp import mcp_tools, parse_servers

            tools.update(mcp_tools(parse_servers(args["mcp_servers"]), tools))
        return [text for t in tools.values() for text in (json.dumps(t.schema), call_text(t.name, {}))]

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory | list[Trajectory]:
        """Play one episode of `env` seeded by the task, calling tools between env steps."""
        return await play_episode(self, ToolEpisode, task, env, llm)


    def call_ids(self, conv: Conversation, before: int, blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """[start, end) among the ids of the reply generated after position `before` of each block
        (its [start, end) in the reply's text), from the lengths of the reply's decoded prefixes
        (the parse saw that text)."""
        first = next(i for i in range(before, len(conv.token_ids)) if conv.loss_mask[i])
        ids = [conv.token_ids[i] for i in range(first, len(conv.token_ids)) if conv.loss_mask[i]]

        def length(k: int) -> int:  # characters the reply's first k + 1 ids decode to
            return len(self.tokenizer.decode(ids[:k + 1], skip_special_tokens=True))

        at = range(len(ids))  # the id holding character c: the first whose prefix is longer than c
        return [(first + bisect.bisect_right(at, start, key=length),
                 first + min(len(ids), bisect.bisect_right(at, end - 1, key=length) + 1)) for start, end in blocks]

    async def answer_calls(self, calls: list[ToolCall], refused: int, usage: ToolUsage) -> list[str]:
        """Each call's answer (run at once), then one answer for the `refused` calls past the
        episode's `max_tool_calls`, which are not run."""
        usage.calls += len(calls) + refused
        answers = list(await asyncio.gather(*(self._run(call, usage) for call in calls)))
        if refused:
            # One answer for them all: a reply of a thousand calls must not grow the sequence by a thousand answers.
            usage.errors += refused
            said = "this call was" if refused == 1 else f"these {refused} calls were"
            answers.append(f"Error: no tool calls left in this episode (at most {self.max_tool_calls}): {said} "
                           "not run; answer without tools")
        return [self._truncate(a) for a in answers]

    async def _run(self, call: ToolCall, usage: ToolUsage) -> str:
        if call.error is not None:
            usage.malformed += 1
            return f"Error: {call.error}"
        assert call.name is not None  # a well-formed call has a string name (ToolCall.ok)
        return await answer_call(self.tools, call.name, call.arguments, self.tool_timeout, usage)

    def _truncate(self, text: str) -> str:
        n = self.max_tool_response_length
        if len(text) <= n:
            return text
        if self.truncate_side == "left":  # verl's: keep the start
            return text[:n] + "...(truncated)"
        if self.truncate_side == "right":
            return "(truncated)..." + text[-n:]
        return text[:n // 2] + "...(truncated)..." + text[-(n // 2):]


class ToolEpisode(Episode):
    """The tool agent's hooks: a reply that calls tools is answered with the tools' answers, and
    the episode's info gets the tool metrics and spans."""

    agent: ToolAgent

    def __init__(self, agent: ToolAgent, task: Task, env: Env, llm: LLMClient, obs: Any) -> None:
        self.usage = ToolUsage()
        self.spans: list[list] = []  # [start, end, kind, name] of each call and each run of answers
        super().__init__(agent, task, env, llm, obs)

    def open(self) -> Conversation:
        instructions = getattr(self.env, "instructions", "")
        return start_conversation(self.agent.tokenizer, self.agent.system_prompt,
                                  f"{instructions}\n{self.obs}" if instructions else self.obs, tools=self.agent.schemas)

    async def answer(self, reply: str | None, before: int) -> bool:
        """Run the reply's tool calls (while calls are left) and add their answers as tool messages."""
        agent, usage, conv = self.agent, self.usage, self.conv
        if reply is None or not agent.tools or OPEN not in reply or usage.calls >= agent.max_tool_calls:
            return False
        calls = parse_tool_calls(reply)
        left = agent.max_tool_calls - usage.calls
        run, rest = calls[:left], calls[left:]
        # The calls past the limit are one block, one name and one answer: a reply of a thousand
        # calls costs what a reply of `max_tool_calls` + 1 does.
        blocks = [(c.start, c.end) for c in run] + ([(rest[0].start, rest[-1].end)] if rest else [])
        names = [c.name if c.name is not None and c.ok else "malformed" for c in run] + ([NOT_RUN] if rest else [])
        self.spans += [[a, b, "call", name] for (a, b), name in zip(agent.call_ids(conv, before, blocks), names)]
        answers = await agent.answer_calls(run, len(rest), usage)
        self.undo = conv.mark()
        conv.add_messages([{"role": "tool", "content": a} for a in answers])
        self.spans.append([self.undo[1], len(conv.token_ids), "answer", ", ".join(names)])
        self.state = "\n".join([self.state, *answers])
        return True

    def closing_info(self) -> dict:
        info = self.info
        metrics = info.get("metrics")
        env_metrics = metrics if isinstance(metrics, dict) else {}
        info["metrics"] = {**env_metrics, **self.usage.metrics(self.success)}
        needs = self.agent.needs_tools if self.agent.needs_tools is not None else bool(getattr(self.env, "needs_tools",
                                                                                              False))
        if needs and self.agent.tools:
            info["needs_tools"] = True
        n = len(self.conv.token_ids)  # answers taken back (no reply could follow) or trimmed are gone
        kept = [[a, min(b, n), kind, name] for a, b, kind, name in self.spans if a < n]
        if kept:
            info["tool_spans"] = kept
        return info


def offer_tools(tools: Sequence[str], tool_args: dict[str, dict] | None, tool_timeout: float,
                needs_tools: bool | None, mcp_servers: list[dict] | None = None) -> dict[str, Tool]:
    """An agent's tools, checked and started (a tool that cannot run here says so now), then the
    tools of its MCP servers (agentrl/tools/mcp.py; connected except in the preflight, which only
    checks the entries); ValueError with one line for a bad setting, as every agent argument."""
    if isinstance(tool_timeout, bool) or not isinstance(tool_timeout, (int, float)) or not tool_timeout > 0:
        raise ValueError(f"tool_timeout={tool_timeout!r}; expected seconds > 0")
    if needs_tools is not None and not isinstance(needs_tools, bool):
        raise ValueError(f"needs_tools={needs_tools!r}; expected true, false or null (the env's needs_tools)")
    try:
        resolved = resolve_tools(tools, tool_args)
        for t in resolved.values():
            t.start()
        if mcp_servers is not None:
            from agentrl.tools.mcp import mcp_tools, parse_servers

            specs = parse_servers(mcp_servers)
            if specs and not checking_only():  # `agentrl plan` starts no server
                resolved.update(mcp_tools(specs, resolved))
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return resolved


def resolve_tools(names: Sequence[str], tool_args: dict[str, dict] | None) -> dict[str, Tool]:
    """The named registered tools with their settings from `tool_args` (one-line errors naming the key)."""
    import agentrl.tools.python  # noqa: F401 (registers the built-in tools)
    import agentrl.tools.search  # noqa: F401

    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"tools={names!r} is not a list of tool names (known: {', '.join(TOOLS.names())})")
    if tool_args is not None and not isinstance(tool_args, dict):
        raise ConfigError(f"tool_args={tool_args!r} is not a mapping of tool name -> settings")
    tool_args = dict(tool_args or {})
    for name in [*names, *tool_args]:
        if name not in TOOLS:
            where = "tools" if name in names else "tool_args"
            raise ConfigError(f"unknown tool {name!r} in {where}.{did_you_mean(name, TOOLS.names())} Known: "
                              f"{', '.join(TOOLS.names())} (a tool of yours: @tool in a module of imports=)")
    if len(set(names)) < len(names):
        raise ConfigError(f"tools={list(names)!r} names a tool twice")
    # Settings of a tool not in use are checked too, and kept for when it is (tools: [] is the no-tool baseline).
    configured = {name: TOOLS.get(name).configure(settings, f"tool_args.{name}")
                  for name, settings in tool_args.items()}
    return {name: configured.get(name) or TOOLS.get(name) for name in names}


def check_int(name: str, value: Any, low: int) -> None:
    """ValueError with one line unless `value` is an int >= `low` (an agent argument named `name`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}; expected an int >= {low}")


register_agent("tool", ToolAgent)
