"""Train agent code written against the `openai` client, unmodified but for its base_url.

`agent.type=openai` with `agent.args.entry="module:function"` (a module name, or a .py path
such as `examples/openai_frozen_lake:run`) plays each episode by calling

    async def run(client: openai.AsyncOpenAI, env: Env, task: Task) -> float | None

with a real `openai.AsyncOpenAI` whose base_url is a session of the session server that runs in
the episodes' own event loop (`/sessions/<id>/v1`, loopback, a random key). The session records every call's prompt ids,
sampled ids and logprobs, token-exact (llm/server/sessions.py); the trajectory is built from them,
one sequence per segment (a history rewrite starts a new one). The function's return value is
the episode's reward; None: the env's step rewards, each credited to the reply before the step.
A reward posted to `/sessions/<id>/reward` counts when the function returns None.

Tools (`agent.args.tools`, `tool_args`, `max_tool_calls`, `tool_timeout`, `needs_tools`, `mcp_servers`: the tool
agent's names and meanings, agents/tool.py): the function passes `tools=[t.schema for t in offered_tools().values()]`
to the client, gets the model's `<tool_call>` blocks back as `tool_calls` (the session server parses
them), runs each with `await call_tool(call.function.name, call.function.arguments)` (the same tool
functions, sandbox and errors as the tool agent) and answers with a `tool` message; the calls are
counted in the episode's `tools/` metrics, and the warm start demonstrates them where the env can
(`env.demonstration`). examples/openai_tools.py is such a function.

Sampling is the run's, whatever the client asks: the trainer recomputes logprobs at
rollout.temperature, so the session decodes with rollout.temperature/top_p/top_k (greedily in
evaluation), seeded by the task and the turn; `max_tokens` is honoured up to
rollout.max_new_tokens, stop strings are. A call with no room left (env.max_turns calls made, plus
`max_tool_calls` when the run offers tools; the context or the episode's token budget spent) gets
an empty reply cut off at its length, and the episode is recorded as truncated for that reason.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrl.agents.loop import turn_sampling
from agentrl.agents.tool import check_int, offer_tools
from agentrl.envs.base import Env
from agentrl.errors import EngineError
from agentrl.llm.conversation import TokenBudget
from agentrl.llm.engine import LLMClient, SamplingParams
from agentrl.registry import import_file, register_agent
from agentrl.tokenizer import Tokenizer
from agentrl.tools.tool import EPISODE_TOOLS, EpisodeTools
from agentrl.trajectory import Task, Trajectory

ENTRY_HELP = ("agent.args.entry must be 'module:function' naming `async def run(client, env, task)` "
              "(the module a name, or a .py path such as examples/openai_frozen_lake:run)")


def resolve_entry(entry: Any) -> Any:
    """The async function `entry` names; ValueError with one line when it cannot be used."""
    if not isinstance(entry, str) or entry.count(":") != 1 or not all(entry.split(":")):
        raise ValueError(f"{ENTRY_HELP}; got {entry!r}")
    module_name, name = entry.split(":")
    try:
        module = _import(module_name)
    except SystemExit as e:  # a module that exits would end the run with nothing said
        raise ValueError(f"agent.args.entry={entry!r}: module {module_name!r} called sys.exit({e.code!r}) while "
                         "being imported; the module must only define the function") from None
    except Exception as e:  # noqa: BLE001 (whatever the user's module raises, one line names it)
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"agent.args.entry={entry!r}: cannot import {module_name!r}: "
                         f"{type(e).__name__}: {first}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"agent.args.entry={entry!r}: module {module_name!r} has no {name!r}")
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"agent.args.entry={entry!r} is not an async function; write `async def {name}(client, env, "
                         "task)`")
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        raise ValueError(f"agent.args.entry={entry!r}: {name}{inspect.signature(fn)} cannot be called as "
                         f"{name}(client, env, task)") from None
    return fn


def _import(module_name: str) -> Any:
    """A module by name, or a .py file by path (with or without the suffix), once per process."""
    path = Path(module_name if module_name.endswith(".py") else module_name + ".py").expanduser()
    if "/" not in module_name and not module_name.endswith(".py") and not path.is_file():
        return importlib.import_module(module_name)
    return import_file(path)


def portable_entry(entry: Any) -> Any:
    """`entry` as another process with another working folder resolves it: a .py path made
    absolute (a Ray actor's folder may differ), a module name as it is."""
    if not isinstance(entry, str) or entry.count(":") != 1:
        return entry  # resolve_entry says what is wrong, where it runs
    module_name, name = entry.split(":")
    path = Path(module_name if module_name.endswith(".py") else module_name + ".py").expanduser()
    if "/" not in module_name and not module_name.endswith(".py") and not path.is_file():
        return entry
    return f"{path.resolve()}:{name}"


class RunSampling:
    """A training session's decoding: the run's sampling, seeded by task and turn, within budget."""

    def __init__(self, base: SamplingParams, task: Task, budget: TokenBudget, max_turns: int) -> None:
        self.base, self.task, self.budget, self.max_turns = base, task, budget, max_turns

    def plan(self, turn: int, prompt_len: int, generated: int, request: Any) -> list[SamplingParams] | str:
        """One SamplingParams per requested choice, or why no reply may follow."""
        if turn >= self.max_turns:
            return "max_turns"
        want = min(request.max_tokens or self.base.max_new_tokens, self.base.max_new_tokens)
        max_new, stop = self.budget.allowance(prompt_len, generated, want)
        if stop:
            return stop
        sp = replace(turn_sampling(self.base, self.task, turn, max_new), stop=tuple(request.stop))
        assert sp.seed is not None  # turn_sampling seeds every turn, by task and turn
        return [replace(sp, seed=(sp.seed + i) % (1 << 63)) for i in range(request.n)]


class _RecordingEnv:
    """The env as the user's function sees it: calls pass through; each step's reward is
    credited to the latest reply, and the outcome is kept for the trajectory."""

    def __init__(self, env: Env, session: Any) -> None:
        self._env, self._session = env, session
        self._info: dict[str, Any] = {}
        self._terminated = self._truncated = False
        self._invalid = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    async def reset(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._env.reset(*args, **kwargs)
        self._session.observation = result[0] if isinstance(result[0], str) else None
        return result

    async def step(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._env.step(*args, **kwargs)
        obs, reward, terminated, truncated, info = result
        self._session.add_env_reward(reward)
        self._session.observation = obs  # the state the next reply acts on
        self._terminated, self._truncated, self._info = bool(terminated), bool(truncated), dict(info)
        self._invalid += int(not info.get("action_valid", True))
        return result


class OpenAIAgent:
    """Runs `entry(client, env, task)` per episode through a session of the loop's session server."""

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams, max_turns: int, system_prompt: str | None = None,
                 budget: TokenBudget | None = None, entry: str = "", timeout: float = 600.0,
                 tools: Sequence[str] = (), tool_args: dict[str, dict] | None = None, max_tool_calls: int = 4,
                 tool_timeout: float = 30.0, needs_tools: bool | None = None,
                 mcp_servers: list[dict] | None = None) -> None:
        self.run_fn = resolve_entry(entry)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"agent.args.timeout={timeout!r} must be a positive number of seconds")
        self.tools = offer_tools(tools, tool_args, tool_timeout, needs_tools, mcp_servers)
        check_int("max_tool_calls", max_tool_calls, 0)
        self.max_tool_calls, self.tool_timeout, self.needs_tools = max_tool_calls, float(tool_timeout), needs_tools
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.max_turns = max_turns
        self.budget = budget or TokenBudget()
        self.timeout = float(timeout)

    async def run_episode(self, task: Task, env: Env, llm: LLMClient) -> Trajectory | list[Trajectory]:
        """Play one episode with the user's function; one trajectory per segment."""
        import httpx
        import openai

        from agentrl.llm.server.app import session_server

        host = await session_server()
        # As the tool agent's: an episode of max_turns env steps may make up to max_tool_calls more calls.
        calls = self.max_turns + (self.max_tool_calls if self.tools else 0)
        policy = RunSampling(self.sampling, task, self.budget, calls)
        session = host.sessions.open(self.tokenizer, llm, asyncio.get_running_loop(), policy,
                                     episode=asyncio.current_task())
        recorder = _RecordingEnv(env, session)
        offered = EpisodeTools(self.tools, self.tool_timeout, self.max_tool_calls)
        token = EPISODE_TOOLS.set(offered)  # this episode's task only
        # One connection per episode (a pool shared by every episode is slow to search).
        http = httpx.AsyncClient(verify=host.ssl_context, timeout=self.timeout)
        client = openai.AsyncOpenAI(base_url=f"{host.url}/sessions/{session.id}/v1", api_key=host.api_key,
                                    # openai 2.x types http_client as an httpx2 client and takes an httpx one (its
                                    # legacy check) at run time.
                                    max_retries=0, timeout=self.timeout, http_client=http)  # type: ignore[arg-type]
        try:
            returned = await self.run_fn(client, recorder, task)
        except Exception as e:
            if session.engine_error is not None:  # the engine failed, not the agent: say so
                raise EngineError(session.engine_error) from e
            raise
        finally:
            EPISODE_TOOLS.reset(token)
            await http.aclose()
            host.sessions.close(session.id)
        reward = _reward(returned, session.posted_reward)
        return self._trajectories(task, session, recorder, reward, offered)

    def _trajectories(self, task: Task, session: Any, env: _RecordingEnv, reward: float | None,
                      offered: EpisodeTools) -> Trajectory | list[Trajectory]:
        reason = None if env._terminated else ("env" if env._truncated else session.stop_reason or "max_turns")
        info = {k: v for k, v in env._info.items() if k != "success"}
        if self.tools:  # as the tool agent's: the tools/ metrics, and the mark the reward_without_tools alarm reads
            found = info.get("metrics")
            metrics: dict[str, Any] = found if isinstance(found, dict) else {}
            info["metrics"] = {**metrics, **offered.usage.metrics(bool(env._info.get("success", False)))}
            needs = self.needs_tools if self.needs_tools is not None else bool(getattr(env._env, "needs_tools", False))
            if needs:
                info["needs_tools"] = True
        segments = session.records(reward) or [(_empty_record(), [], 0)]
        if self.budget.context:  # a reply that filled the context keeps no closing past it (as ChatAgent)
            last = segments[-1][0]
            last.truncate(max(self.budget.context, len(last.token_ids) - len(_tail_zeros(last.loss_mask))))
        out = [Trajectory.from_record(record, task, states, success=bool(env._info.get("success", False)),
                                      terminated=env._terminated, truncation_reason=reason, info=dict(info),
                                      invalid_actions=env._invalid if i == len(segments) - 1 else 0,
                                      truncated_replies=cut, segment=i)
               for i, (record, states, cut) in enumerate(segments)]
        return out[0] if len(out) == 1 else out


def _tail_zeros(mask: list[int]) -> list[int]:
    """The mask-0 ids after the last generated one."""
    k = len(mask)
    while k and not mask[k - 1]:
        k -= 1
    return mask[k:]


def _empty_record() -> Any:
    from agentrl.trajectory import TokenRecord

    return TokenRecord()


def _reward(returned: Any, posted: float | None) -> float | None:
    """The episode's reward: what the function returned, else a posted one, else None (env rewards)."""
    if returned is None:
        return posted
    if isinstance(returned, bool) or not isinstance(returned, (int, float)) or not math.isfinite(returned):
        raise TypeError(f"the agent function returned {returned!r}; return the episode's reward as a finite "
                        "number, or None to use the env's rewards")
    return float(returned)


register_agent("openai", OpenAIAgent)
