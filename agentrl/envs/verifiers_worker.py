"""The verifiers side of `env.type=verifiers`: a worker run with .venv-verifiers' python, speaking JSON lines.

It runs in an environment of its own (verifiers 0.4.0 pins mcp==2.0.0 and openai<3, ours are newer), so
this file imports only the standard library at the top and verifiers inside its functions: nothing of
agentrl. `agentrl/envs/verifiers.py` starts it as `[python, this file]` and sends one request per line
on stdin; each answer is one line on stdout, `{"ok": ...}` or `{"error": "one line"}`.

Requests (`op`):
- `load` {load, eval_load, paths, max_rows}: import the environment (`module:function` returning a
  `vf.Env` or `vf.Taskset`, or an installed taskset id for `vf.load_environment`), and the one that
  plays evaluation seeds (`eval_load`, else the same); answers the number of tasks of each split.
- `rows` {split}: each task's data (`TaskData.model_dump`).
- `reset` {episode, split, row}: start the env's own `run()` on that task, with agentrl in the policy's
  seat; answers the first observation: `system` (the task's system prompt) and `messages` (the user
  messages the policy reads before its first reply).
- `step` {episode, reply}: the policy's reply to its seat; the env goes on to the next user turn
  (`{messages, done: false}`) or to its end, scored by the task's own `@vf.reward`s (and the env's
  `finalize`): `{done: true, reward, rewards, metrics, stop}`.
- `score` {split, row, messages}: the task's rewards for a finished conversation (no env involved).
- `close` {episode}: drop an episode (truncated by agentrl's turn limit).

Generation stays agentrl's: no harness, runtime or model client of verifiers runs here. The env's
`run(task, agents)` gets agents whose `run(task)` and `interaction(task)` wait on agentrl's replies.
"""

from __future__ import annotations

import sys

# Run as a script, this file's folder (agentrl/envs) comes first on sys.path, and its math.py would
# shadow the standard library's: drop it before any other import.
if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False) and sys.path:
    del sys.path[0]

import asyncio  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import traceback  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from typing import Any  # noqa: E402

POLICY = "policy"  # the seat agentrl plays when the env names none yet


class WorkerError(Exception):
    """A request the worker refuses, with the one line to send back."""


def _vf() -> Any:
    return importlib.import_module("verifiers.v1")


def load_object(spec: str) -> Any:
    """`module:function` called with no arguments, or an installed taskset id made into its env."""
    if ":" in spec:  # the user's module first: a missing one fails before verifiers' own imports
        module_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # noqa: BLE001 (any import failure is the user's module: one line)
            raise WorkerError(f"cannot import {module_name!r}: {type(e).__name__}: {e}") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise WorkerError(f"{module_name!r} has no function {attr!r}")
        obj = fn()
        vf = _vf()
    else:
        vf = _vf()
        try:
            obj = vf.load_environment(vf.resolve_env_config({"taskset": {"id": spec}}))
        except Exception as e:  # noqa: BLE001
            raise WorkerError(f"cannot load the environment id {spec!r}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(obj, (vf.Env, vf.Taskset)):
        raise WorkerError(f"{spec!r} gave a {type(obj).__name__}, not a verifiers.v1 Env or Taskset")
    return obj


def tasks_of(obj: Any, max_rows: int) -> list[Any]:
    """The taskset's tasks (at most `max_rows` of an infinite one)."""
    taskset = obj.taskset if isinstance(obj, _vf().Env) else obj
    view = taskset if taskset.bounded else taskset.take(max_rows)
    return list(view)[:max_rows]


def opening(task: Any) -> list[Any]:
    """The messages a task opens with: its system prompt, then its prompt (text or messages)."""
    vf = _vf()
    out: list[Any] = []
    if task.data.system_prompt:
        out.append(vf.SystemMessage(content=task.data.system_prompt))
    prompt = task.data.prompt
    if isinstance(prompt, str):
        out.append(vf.UserMessage(content=prompt))
    elif prompt:
        out.extend(prompt)
    return out


def new_trace(task: Any, seat: str) -> Any:
    """An empty trace of `task` for `seat`, as verifiers records one."""
    vf = _vf()
    return vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                    agent=vf.AgentInfo(config=vf.AgentConfig(), name=seat))


def append(trace: Any, message: Any, sampled: bool) -> None:
    """One message onto the trace's single branch."""
    graph = importlib.import_module("verifiers.v1.graph")
    parent = len(trace.nodes) - 1 if trace.nodes else None
    trace.nodes.append(graph.MessageNode(parent=parent, message=message, sampled=sampled))


def text_of(message: Any) -> str:
    """A message's text (its text parts joined)."""
    types = importlib.import_module("verifiers.v1.types")
    return types.content_text(message.content) or ""


def parse(message: Any) -> Any:
    """A wire dict as verifiers' typed message."""
    chat = importlib.import_module("verifiers.v1.dialects.chat")
    return chat.parse_message(message) if isinstance(message, dict) else message


async def score(task: Any, trace: Any) -> None:
    """The task's own scoring: its `@vf.metric`s and `@vf.reward`s (weighted) onto the trace."""
    trace.is_completed = True
    await task.score(trace)
    trace.ok = True


def trace_stops(task: Any, trace: Any) -> str | None:
    """The first of the task's `@vf.stop` predicates over the trace that holds, by name."""
    session = importlib.import_module("verifiers.v1.session")
    decorators = importlib.import_module("verifiers.v1.utils.decorators")
    vf = _vf()
    for fn in task.hooks("stop"):
        if session.hook_boundary(fn, allow_trace=True) is vf.Trace:
            result = decorators.invoke(fn, {"trace": trace, "task": task.data, vf.Trace: trace})
            if asyncio.iscoroutine(result):
                raise WorkerError(f"async @vf.stop {fn.__name__} is not supported here")
            if result:
                return str(fn.__name__)
    return None


class Episode:
    """One episode of the env: its coroutine, the events it sends agentrl and the reply it waits on."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.reply: asyncio.Future[str] | None = None
        self.seat: str | None = None
        self.runner: asyncio.Task[None] | None = None

    async def ask(self, messages: list[Any]) -> str:
        """Show agentrl the new user messages and wait for the policy's reply."""
        system = next((text_of(m) for m in messages if m.role == "system"), None)
        users = [text_of(m) for m in messages if m.role != "system"]
        self.reply = asyncio.get_running_loop().create_future()
        await self.events.put({"done": False, "system": system, "messages": users})
        return await self.reply


class Interaction:
    """verifiers' `Interaction` with agentrl in the seat: `turn()` returns the policy's reply as a Segment."""

    def __init__(self, episode: Episode, task: Any, seat: str) -> None:
        self.episode, self.task, self.seat = episode, task, seat
        self.trace = new_trace(task, seat)
        self._started = False
        self._over = False

    async def turn(self, message: Any = None) -> Any:
        """One user turn (None on a prompted task's opening), then the policy's reply."""
        vf = _vf()
        if self._over:
            return vf.Segment(messages=[], terminated=True)
        new: list[Any] = [] if self._started else opening(self.task)
        if isinstance(message, str):
            new.append(vf.UserMessage(content=message))
        elif message is not None:
            new.extend(parse(m) for m in message)
        if not new:
            raise WorkerError("turn() with no message after the opening: nothing for the policy to read")
        self._started = True
        for m in new:
            append(self.trace, m, sampled=False)
        reply = await self.episode.ask(new)
        append(self.trace, vf.AssistantMessage(content=reply), sampled=True)
        stop = trace_stops(self.task, self.trace)
        if stop is not None:
            self.trace.stop(stop)
            self._over = True
        return vf.Segment(messages=[self.trace.nodes[-1].message])

    async def close(self) -> Any:
        """Score the finished exchange with the task's rewards; the trace."""
        if not self.trace.is_completed:
            await score(self.task, self.trace)
        return self.trace


class Seat:
    """One agent of the env's `agents`: agentrl plays the first one used; a second needs a model of its own."""

    def __init__(self, episode: Episode, name: str, traces: list[Any]) -> None:
        self.episode, self.name, self.traces = episode, name, traces
        self.trainable = True

    def _claim(self) -> None:
        if self.episode.seat not in (None, self.name):
            raise WorkerError(f"the env runs a second agent {self.name!r} besides {self.episode.seat!r}: "
                              "agentrl plays one seat; a seat played by another model is not supported")
        self.episode.seat = self.name

    @asynccontextmanager
    async def interaction(self, task: Any) -> Any:
        """An exchange held open turn by turn; scored when the block ends."""
        self._claim()
        inter = Interaction(self.episode, task, self.name)
        try:
            yield inter
        finally:
            self.traces.append(await inter.close())

    async def run(self, task: Any) -> Any:
        """A whole rollout of `task`: the opening, the policy's one reply (no tools), scored."""
        async with self.interaction(task) as inter:
            await inter.turn()
        return inter.trace


class Agents:
    """The env's `agents`: a seat per attribute name."""

    def __init__(self, episode: Episode) -> None:
        self._episode = episode
        self._seats: dict[str, Seat] = {}
        self.traces: list[Any] = []

    def __getattr__(self, name: str) -> Seat:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._seats:
            self._seats[name] = Seat(self._episode, name, self.traces)
        return self._seats[name]


class Worker:
    """The loaded environment and its live episodes."""

    def __init__(self) -> None:
        self.envs: dict[str, Any] = {}  # the Env that plays each split (None: a plain taskset, one seat's run)
        self.splits: dict[str, list[Any]] = {}
        self.episodes: dict[str, Episode] = {}

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        """Answer one request."""
        op = req.get("op")
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise WorkerError(f"unknown op {op!r}")
        return await handler(req)

    async def op_load(self, req: dict[str, Any]) -> dict[str, Any]:
        for path in reversed(req.get("paths") or []):
            sys.path.insert(0, path)
        obj = load_object(req["load"])
        max_rows = int(req.get("max_rows") or 100000)
        eval_obj = load_object(req["eval_load"]) if req.get("eval_load") else obj
        self.splits["train"] = tasks_of(obj, max_rows)
        self.splits["eval"] = tasks_of(eval_obj, max_rows) if eval_obj is not obj else self.splits["train"]
        self.envs = {split: (o if isinstance(o, _vf().Env) else None)
                     for split, o in (("train", obj), ("eval", eval_obj))}
        for split, tasks in self.splits.items():
            if not tasks:
                raise WorkerError(f"{req['load'] if split == 'train' else req['eval_load']!r} has no tasks")
        name = type(obj).__name__
        return {"name": name, "train": len(self.splits["train"]), "eval": len(self.splits["eval"])}

    def task(self, req: dict[str, Any]) -> Any:
        tasks = self.splits[req.get("split", "train")]
        return tasks[int(req["row"]) % len(tasks)]

    async def op_rows(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"rows": [t.data.model_dump(mode="json", exclude_none=True)
                         for t in self.splits[req.get("split", "train")]]}

    async def op_reset(self, req: dict[str, Any]) -> dict[str, Any]:
        await self.op_close(req)
        episode = Episode()
        self.episodes[req["episode"]] = episode
        env = self.envs[req.get("split", "train")]
        episode.runner = asyncio.get_running_loop().create_task(self._play(episode, env, self.task(req)))
        return await episode.events.get()

    async def op_step(self, req: dict[str, Any]) -> dict[str, Any]:
        episode = self.episodes.get(req["episode"])
        if episode is None or episode.reply is None or episode.reply.done():
            raise WorkerError("step on an episode that is not waiting for a reply; reset it first")
        episode.reply.set_result(str(req["reply"]))
        event = await episode.events.get()
        if event["done"]:
            self.episodes.pop(req["episode"], None)
        return event

    async def op_close(self, req: dict[str, Any]) -> dict[str, Any]:
        episode = self.episodes.pop(req["episode"], None)
        if episode is not None and episode.runner is not None and not episode.runner.done():
            episode.runner.cancel()
            try:
                await episode.runner
            except BaseException:  # noqa: BLE001 (its cancellation, or the env's own error on the way out)
                pass
        return {}

    async def op_score(self, req: dict[str, Any]) -> dict[str, Any]:
        task = self.task(req)
        trace = new_trace(task, POLICY)
        for m in req["messages"]:
            message = parse(m)
            append(trace, message, sampled=message.role == "assistant")
        await score(task, trace)
        return outcome(trace)

    async def _play(self, episode: Episode, env: Any, task: Any) -> None:
        """The env's `setup`, `run` and `finalize` on `task` (a plain taskset: one seat's `run`)."""
        vf = _vf()
        agents = Agents(episode)
        try:
            if env is None:
                await agents.agent.run(task)
            else:
                await env.setup(agents)
                await env.run(task, agents)
                record = vf.Episode(env=vf.EnvInfo(id=env.config.env_id),
                                    task=vf.TraceTask(type=type(task).__name__, data=task.data))
                record.traces.extend(agents.traces)
                await env.finalize(task, record)
            mine = [t for t in agents.traces if t.agent.name == episode.seat]
            if not mine:
                raise WorkerError("the env's run() ended before the policy replied")
            event = {"done": True, **outcome(mine[-1])}
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 (the env's failure is this episode's, sent back as one line)
            event = {"done": True, "error": one_line(e)}
        await episode.events.put(event)


def outcome(trace: Any) -> dict[str, Any]:
    """What agentrl keeps of a scored trace: the weighted sum, each reward and metric, the stop."""
    rewards = {k: (None if r is None else r.score) for k, r in trace.rewards.items()}
    weights = {k: r.weight for k, r in trace.rewards.items() if r is not None}
    metrics = {k: v for k, v in trace.metrics.items() if v is not None}
    return {"reward": float(trace.reward), "rewards": rewards, "weights": weights, "metrics": metrics,
            "stop": trace.stop_condition}


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def main() -> None:
    """Serve requests from stdin until it closes."""
    import logging

    logging.disable(logging.WARNING)  # the library's own warnings would go to stderr, unread
    answers, sys.stdout = sys.stdout, sys.stderr  # an env's print() must not land among the answers
    worker = Worker()
    loop = asyncio.new_event_loop()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer: dict[str, Any] = {"ok": loop.run_until_complete(worker.handle(json.loads(line)))}
        except WorkerError as e:
            answer = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 (never die on one bad request: answer it)
            answer = {"error": one_line(e), "traceback": traceback.format_exc(limit=3)}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    # stdin closed: agentrl is done with us. Skip the interpreter's teardown of verifiers' many modules
    # (seconds); nothing is left to flush or release that the exit itself does not.
    os._exit(0)


if __name__ == "__main__":
    main()
