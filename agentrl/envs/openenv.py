"""OpenEnv environment servers on agentrl's env contract: `env.type=openenv env.args.url=...`.

## Description
Any OpenEnv environment (Meta's openenv-core, 0.3): a running server named by `url`, or an app
agentrl serves on loopback for the run's life (`app: module:attr`, e.g.
`examples/openenv_server:app`, started once per process: each Ray env manager serves its own).
Each episode is one session on the server: a WebSocket session (`/ws`, through openenv-core's own
async client, `GenericEnvClient`: the server gives each connection its own environment
instance), or, on a server without `/ws`, HTTP's `/reset` and `/step` (one episode at a time in
this process, since such a server keeps one state). The server's dynamics, rewards and endings
are kept; this module turns the observation into text and the reply into the action's fields.

## Action format
Read from the server's own action schema (`GET /schema`, the Action model's JSON schema) by
`agentrl/envs/openenv_schema.py`: the content of the reply's last `<answer>...</answer>` is a JSON
object of the fields, or for an action of one field its value alone (`<answer>7</answer>`), or
`name=value` pairs separated by `;` (`<answer>direction=up; steps=2</answer>`). Values are checked
against the schema's types, enums and bounds. A reply that does not parse, or an action the
server refuses as invalid (its validation error), is an invalid action: it never changes the
server's state, pays `format_penalty`, counts in `rollout/invalid_actions`, and the episode goes on
(the observation says what was wrong; `invalid: continue`) or ends (`invalid: end`).
`parse: module:function` replaces the parsing: `function(reply: str) -> dict | None` (None:
invalid); `instructions` then replaces the format line it no longer matches.

## Observation format
The observation's fields (OpenEnv sends them without `reward`, `done` and `metadata`) as
`name: value` lines, text as it is and other values as JSON, in the server's order.
`render: module:function` replaces it: `function(observation: dict) -> str`. `instructions` names
the environment (its `/metadata`), its description and the reply format, each field with its type.

## Starting state
The server's `reset(seed=...)` with the episode's seed: the same seed replays the episode as far as
the server's environment is seeded by it (agentrl draws nothing).

## Rewards
The server's, step by step (a `None` reward is 0); an invalid action pays `format_penalty`.

## Episode end
The server's `done` is `terminated`; `env.max_turns` truncates, as for every env.
`info["success"]` is a final reward >= `success_threshold` (1.0), or the observation's own boolean
`success` field where it has one. A server error (an exception in its environment, a lost
connection) raises an EnvError: that episode fails and is counted, the run goes on. A server that
does not answer within `timeout` seconds is an EnvError line during a run and a ConfigError line
from `agentrl plan`, as is an unreachable `url` or a `module:attr` that does not load.

## Reference
`eval_baselines` gives `baseline_random`: `sample_action` (a uniformly random valid value of every
required field of the schema) at every turn, against the server, for at most `baseline_turns` turns,
`baseline_plays` plays per evaluated seed (cached: evaluation plays the same seeds every time). No
expert exists for an arbitrary server, so there is no `demonstration`: the warm start's replies
are `sample_action`'s, which teach the reply format only.

## Arguments
`url` or `app` (one of them), `transport` (auto, websocket, http), `timeout`, `sessions` (episodes
at once against the server per process: at most the server's `max_concurrent_envs`, 1 by default
as openenv-core's is), `render`, `parse`, `instructions`, `invalid`, `format_penalty`,
`success_threshold`, `baseline_plays`, `baseline_turns`.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable
from typing import Any

from agentrl.envs.args import REWARD_MAX, check_arg, is_count, is_number, is_reward
from agentrl.envs.openenv_schema import ActionFields, render_observation
from agentrl.envs.openenv_serve import load_attr, serve_app
from agentrl.envs.openenv_wire import Refused, ServerInfo, Session, gate, import_openenv, server_info
from agentrl.envs.references import PerSeeds, policy_success, run_apart
from agentrl.errors import ConfigError, EnvError
from agentrl.registry import register_env

TRANSPORTS = ("auto", "websocket", "http")
INVALID = ("continue", "end")
_check = functools.partial(check_arg, "openenv")


class OpenEnvEnv:
    """An OpenEnv server's environment: one session per episode, observations as text, replies as actions."""

    def __init__(self, url: str | None = None, app: str | None = None, transport: str = "auto",
                 timeout: float = 30.0, sessions: int = 1, render: str | None = None, parse: str | None = None,
                 instructions: str | None = None, invalid: str = "continue", format_penalty: float = -0.1,
                 success_threshold: float = 1.0, baseline_plays: int = 4, baseline_turns: int = 8) -> None:
        _check((url is None) != (app is None), "url", url,
               "the URL of a running OpenEnv server (http://host:port), or leave it out and give "
               "app=module:attr for agentrl to serve the app; one of the two")
        _check(url is None or (isinstance(url, str) and url.startswith(("http://", "https://"))), "url", url,
               "an http:// or https:// URL such as http://127.0.0.1:8000")
        _check(transport in TRANSPORTS, "transport", transport, f"one of {', '.join(TRANSPORTS)}")
        _check(is_number(timeout) and 0 < timeout <= 3600, "timeout", timeout, "seconds, above 0 and at most 3600")
        _check(is_count(sessions, 1, 1024), "sessions", sessions, "an int from 1 to 1024")
        _check(invalid in INVALID, "invalid", invalid, f"one of {', '.join(INVALID)}")
        _check(is_reward(format_penalty), "format_penalty", format_penalty,
               f"a number from -{REWARD_MAX:g} to {REWARD_MAX:g}")
        _check(is_reward(success_threshold), "success_threshold", success_threshold,
               f"a number from -{REWARD_MAX:g} to {REWARD_MAX:g}")
        _check(instructions is None or (isinstance(instructions, str) and bool(instructions.strip())),
               "instructions", instructions, "non-empty text")
        _check(is_count(baseline_plays, 1, 1000), "baseline_plays", baseline_plays, "an int from 1 to 1000")
        _check(is_count(baseline_turns, 1, 1000), "baseline_turns", baseline_turns, "an int from 1 to 1000")
        import_openenv()
        self.timeout, self.invalid = float(timeout), invalid
        self.format_penalty, self.success_threshold = float(format_penalty), float(success_threshold)
        self.baseline_plays, self.baseline_turns = baseline_plays, baseline_turns
        self._render: Callable[[dict[str, Any]], str] = (
            render_observation if render is None
            else _callable(load_attr(render, "env.args.render", "a function(observation: dict) -> str"), "render"))
        self._parse = None if parse is None else _callable(
            load_attr(parse, "env.args.parse", "a function(reply: str) -> dict | None"), "parse")
        self.url = url if url is not None else serve_app(str(app), self.timeout)
        self.info: ServerInfo = server_info(self.url.rstrip("/"), self.timeout, transport)
        try:
            self.fields = ActionFields(self.info.action_schema)
        except ValueError as e:
            raise ConfigError(f"openenv: url={self.url!r}: {e}") from None
        # A server without sessions keeps one episode's state: its episodes take turns.
        self.sessions = sessions if self.info.transport == "websocket" else 1
        about = f" {self.info.description}" if self.info.description else ""
        self.instructions = f"OpenEnv environment {self.info.name}.{about} {instructions or self.fields.format_line()}"
        self._session: Session | None = None
        self._gate: asyncio.Semaphore | None = None
        self._done = True
        self._references = PerSeeds(lambda seeds: {"random": run_apart(self._random_success(seeds))})

    async def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """A new session on the server, reset with `seed`."""
        await self._end_session()
        self._gate = gate(self.info.url, self.sessions)
        await self._gate.acquire()
        self._session = Session(self.info, self.timeout)
        try:
            result = await self._session.reset(seed)
        except BaseException:
            await self._end_session()
            raise
        self._done = False
        return self._text(result, "reset"), {"seed": seed}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Parse the reply into the action's fields and step the server; an invalid reply is a penalised no-op."""
        if self._done or self._session is None:
            raise EnvError("openenv: step() called on a finished episode; call reset() first")
        fields, why = self._parsed(action)
        if fields is not None:
            try:
                result = await self._session.step(fields)
            except Refused as e:
                fields, why = None, f"the server refused it ({' '.join(str(e).split())[:200]})"
        if fields is None:
            return await self._invalid(why)
        reward = result.get("reward")
        reward = 0.0 if reward is None else reward
        if not is_number(reward) or isinstance(reward, bool):
            raise EnvError(f"openenv: the server at {self.info.url} answered reward={reward!r}; "
                           "expected a finite number")
        text = self._text(result, "step")
        info: dict[str, Any] = {"action_valid": True, "action": fields}
        if not result.get("done"):
            return text, float(reward), False, False, info
        observation = result.get("observation")
        flag = observation.get("success") if isinstance(observation, dict) else None
        info["success"] = flag if isinstance(flag, bool) else reward >= self.success_threshold
        await self._end_session()
        return text, float(reward), True, False, info

    def _parsed(self, reply: str) -> tuple[dict[str, Any] | None, str]:
        if self._parse is None:
            return self.fields.parse(reply)
        fields = self._parse(reply if isinstance(reply, str) else "")
        if fields is not None and not isinstance(fields, dict):
            raise EnvError(f"openenv: env.args.parse returned {type(fields).__name__}; expected a dict of the "
                           "action's fields, or None for an invalid reply")
        return fields, "" if fields is not None else "the reply does not parse (env.args.parse)"

    async def _invalid(self, why: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info: dict[str, Any] = {"action_valid": False, "reason": why}
        text = f"Invalid action: {why}."  # the format is in the instructions, which the conversation holds
        if self.invalid == "end":
            info["success"] = False
            await self._end_session()
            return text, self.format_penalty, True, False, info
        return text, self.format_penalty, False, False, info

    def _text(self, result: dict[str, Any], what: str) -> str:
        observation = result.get("observation")
        if not isinstance(observation, dict):
            raise EnvError(f"openenv: {what} on the server at {self.info.url} answered observation="
                           f"{type(observation).__name__}; expected a JSON object")
        text = self._render(observation)
        if not isinstance(text, str):
            raise EnvError(f"openenv: the observation's render returned {type(text).__name__}; expected str")
        return text

    async def _end_session(self) -> None:
        """Close the session and let the next episode have its place."""
        self._done = True
        session, held, self._session, self._gate = self._session, self._gate, None, None
        await _finish(session, held)

    def sample_action(self, rng: random.Random) -> str:
        """A well-formed reply carrying a uniformly random valid value of every required field."""
        return self.fields.reply(self.fields.sample(rng))

    def eval_baselines(self, trajectories: list) -> dict[str, float]:
        """The random policy's success on the evaluated seeds (see Reference)."""
        return self._references(trajectories)

    async def _random_success(self, seeds: tuple[int, ...]) -> float:
        """Mean success of `sample_action` at every turn over `baseline_plays` plays of each seed."""
        env = self._fresh()
        try:
            return await policy_success(env, env.sample_action, seeds, self.baseline_plays, self.baseline_turns)
        finally:  # each reset ended the play before it; the last one's session ends here
            await env._end_session()

    def _fresh(self) -> OpenEnvEnv:
        """An env of the same server and settings, for the reference's own episodes."""
        env = object.__new__(OpenEnvEnv)
        env.__dict__.update(self.__dict__)
        env._session, env._gate, env._done = None, None, True
        return env

    def close(self) -> None:
        """End the episode: its session is closed on the running loop, then its place is given back."""
        self._done = True
        session, held, self._session, self._gate = self._session, self._gate, None, None
        if session is None and held is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: the connection goes with the object, and so does the loop's gate
            return
        task = loop.create_task(_finish(session, held))
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)


_CLOSING: set[asyncio.Task] = set()  # sessions being closed by close(): held until done


async def _finish(session: Session | None, held: asyncio.Semaphore | None) -> None:
    """Close `session`, then give its place back (the server counts a session until it is closed)."""
    try:
        if session is not None:
            await session.aclose()
    except Exception:  # noqa: BLE001 (a session that cannot close cleanly is closed all the same)
        pass
    finally:
        if held is not None:
            held.release()


def _callable(fn: Any, field: str) -> Any:
    if not callable(fn):
        raise ConfigError(f"openenv: env.args.{field} names a {type(fn).__name__}, not a function")
    return fn


register_env("openenv", OpenEnvEnv)
