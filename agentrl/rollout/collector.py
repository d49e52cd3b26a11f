"""Runs a step's episodes concurrently and returns their trajectories, group by group.

This is the seam between multi-turn rollout and training: everything after `collect` sees
only token sequences with a loss mask. Episodes run as asyncio tasks, each with its own env
instance; their engine requests meet in the engine's batches. Each task names its env
definition (its tag): the collector builds that tag's env and plays it with that tag's agent,
so one batch can mix FrozenLake, Sokoban and math.

Faults stay inside the episode they hit. An env or agent exception, an engine error or a
timeout (`timeout` seconds per attempt) ends that attempt with its reason recorded; the episode
is retried with a fresh env (same env seed, so it stays in its group; a new sampling seed, so
the retry is a new sample) up to `max_retries` times. When the retries run out the whole group
is dropped: a partial group would bias the group baseline. A timeout can only interrupt an
episode at an `await`: env work that may take long belongs off the event loop (see envs/base.py).

`collect` runs the event loop in a thread of its own and watches it from the calling thread,
which so stays responsive to Ctrl-C and SIGTERM whatever the episodes do: with a timeout, a loop
that stops running (env code blocking it) for longer than the timeout is a RolloutError; without
one, a collection still running after HANG_WARN_SECONDS gets a warning.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agentrl.envs.contract import reset_problem, step_problem
from agentrl.errors import EngineError, RolloutError
from agentrl.rollout.tasks import retry_seed
from agentrl.trajectory import Task, Trajectory

if TYPE_CHECKING:  # types only: the collector imports the env contract's checks, never an env or agent
    from agentrl.agents.base import Agent
    from agentrl.envs.base import Env
    from agentrl.llm.engine import LLMClient

FAILURE_KINDS = ("env", "agent", "engine", "timeout", "worker")  # worker: the process playing it died (Ray)
WATCH_SECONDS = 1.0  # how often the calling thread checks on the episodes' event loop
HANG_WARN_SECONDS = 600.0  # without an episode timeout, warn once when a collection runs this long


def warn_hang(message: str) -> None:
    """Tell the user a collection may hang (stderr, where the CLI writes its log)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


@dataclass
class TagSpec:
    """How episodes of one tag are played: a fresh env per episode, and the agent."""

    env_factory: Callable[[], "Env"]
    agent: "Agent"


class LoopWatch:
    """Watches an event loop that runs episodes from another thread, which stays free to take a
    Ctrl-C: `check` raises a RolloutError once the loop has not run for longer than the episode
    timeout (env code blocking it), and without a timeout warns once after HANG_WARN_SECONDS."""

    def __init__(self, timeout: float | None, waiting: str) -> None:
        self.timeout = timeout
        self.waiting = waiting  # what is awaited, for the warning: "32 episodes have been collecting"
        self.start = self.beat = time.monotonic()
        self.warned = False

    def check(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Call about every WATCH_SECONDS while waiting on `loop` (None: not started yet)."""
        now = time.monotonic()
        if self.timeout is not None and loop is not None:
            blocked = now - self.beat
            if blocked > self.timeout + 2 * WATCH_SECONDS:
                raise RolloutError(
                    f"the episodes' event loop has not run for {blocked:.0f} s, longer than "
                    f"rollout.episode_timeout={self.timeout}s: env or agent code blocks it (synchronous "
                    "work inside an async reset/step); run such work with `await asyncio.to_thread(...)`")
            try:  # the loop stamps the time when it gets to run this
                loop.call_soon_threadsafe(self._stamp)
            except RuntimeError:  # the loop closed meanwhile: the wait is about to end
                pass
        elif self.timeout is None and not self.warned and now - self.start > HANG_WARN_SECONDS:
            self.warned = True
            warn_hang(f"{self.waiting} for {now - self.start:.0f} s; if an env or agent "
                      "hangs, set rollout.episode_timeout to end such episodes")

    def _stamp(self) -> None:
        self.beat = time.monotonic()


@dataclass
class CollectResult:
    """Trajectories of the groups that completed, and what went wrong with the others."""

    trajectories: list[Trajectory]
    errors: list[str] = field(default_factory=list)  # one line per failed attempt: "kind: message"
    dropped_groups: int = 0  # groups left out because one of their episodes ran out of retries
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_KINDS, 0))
    retries: int = 0  # attempts beyond the first
    failed_episodes: int = 0  # episodes whose every attempt failed
    episodes: int = 0  # episodes asked for
    segments: int = 0  # extra sequences of episodes whose history was rewritten (agents/openai.py)

    def absorb(self, other: CollectResult) -> None:
        """Add another collection's counts and errors to this one (trajectories are not merged)."""
        self.errors += other.errors
        self.dropped_groups += other.dropped_groups
        for kind, n in other.failures.items():
            self.failures[kind] = self.failures.get(kind, 0) + n
        self.retries += other.retries
        self.failed_episodes += other.failed_episodes
        self.episodes += other.episodes
        self.segments += other.segments

    def metrics(self) -> dict[str, float]:
        """rollout/* counts of failures, retries, dropped groups and extra segments."""
        out = {f"rollout/failures_{kind}": float(n) for kind, n in self.failures.items()}
        out.update({"rollout/errors": float(len(self.errors)), "rollout/retries": float(self.retries), "rollout/failed_episodes": float(self.failed_episodes),
                    "rollout/dropped_groups": float(self.dropped_groups), "rollout/segments": float(self.segments)})
        return out


class EnvFailure(Exception):
    """An exception raised inside the env's reset or step (as opposed to the agent's code)."""


class _GuardedEnv:
    """The env as the agent sees it: calls pass through, the env's own exceptions are tagged,
    and what reset and step return is checked against the env contract (envs/contract.py), so a
    reward "1.0", a NaN reward or info["success"]="no" fails the episode as an env error naming
    the field instead of being coerced. `per_answer`: a seed-style env (one reward per answer)."""

    def __init__(self, env: Any, per_answer: bool = False) -> None:
        self._env = env
        self._per_answer = per_answer
        self.reset_info: dict[str, Any] = {}  # the first reset's info, for the trajectory
        self._reset = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    async def reset(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = await self._env.reset(*args, **kwargs)
        except Exception as e:
            raise EnvFailure(_describe(e, "reset")) from e
        self._check("reset", reset_problem(result, per_answer=self._per_answer))
        if not self._reset and isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
            self.reset_info = dict(result[1])
        self._reset = True
        return result

    async def step(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = await self._env.step(*args, **kwargs)
        except Exception as e:
            raise EnvFailure(_describe(e, "step")) from e
        self._check("step", step_problem(result, strict=False, per_answer=self._per_answer))
        return result

    def _check(self, method: str, problem: tuple[str, str] | None) -> None:
        if problem is not None:
            raise EnvFailure(f"EnvError in {method}: {type(self._env).__name__}.{method}() {problem[1]}")


class RolloutCollector:
    """Plays many episodes at once, each with its tag's env and agent, through one engine."""

    def __init__(self, tags: Mapping[str, TagSpec], llm: "LLMClient", *,
                 timeout: float | None = None, max_retries: int = 0) -> None:
        if not tags:
            raise ValueError("RolloutCollector needs at least one tag")
        self.tags = dict(tags)
        self.llm = llm
        self.timeout = timeout
        self.max_retries = max_retries

    @classmethod
    def single(cls, env_factory: Callable[[], "Env"], agent: "Agent", llm: "LLMClient", tag: str = "",
               **kw: Any) -> RolloutCollector:
        """A collector of one env and one agent (tasks carry `tag`, "" by default)."""
        return cls({tag: TagSpec(env_factory, agent)}, llm, **kw)

    def collect(self, tasks: list[Task]) -> CollectResult:
        """Run every task to the end (blocking); keep only groups whose episodes all finished."""
        live: dict[str, Any] = {"loop": None, "task": None}
        done, box = threading.Event(), {}

        async def main() -> CollectResult:
            live["loop"], live["task"] = asyncio.get_running_loop(), asyncio.current_task()
            return await self.acollect(tasks)

        def run() -> None:
            try:
                box["result"] = asyncio.run(main())
            except BaseException as e:  # handed to the calling thread
                box["error"] = e
            finally:
                done.set()

        # A daemon thread: an env blocked for good must not keep the process alive after an interrupt.
        threading.Thread(target=run, name="agentrl-collect", daemon=True).start()
        try:
            self._watch(done, live, len(tasks))
        except BaseException:
            loop, task = live["loop"], live["task"]
            if loop is not None and task is not None and not done.is_set():
                try:
                    loop.call_soon_threadsafe(task.cancel)  # episodes that can still stop, stop
                except RuntimeError:  # the loop closed meanwhile
                    pass
            raise
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _watch(self, done: threading.Event, live: dict[str, Any], n: int) -> None:
        """Wait for the collection; raise when its loop is blocked past the timeout, warn on a long one."""
        watch = LoopWatch(self.timeout, f"{n} episodes have been collecting")
        while not done.wait(WATCH_SECONDS):
            watch.check(live["loop"])

    async def acollect(self, tasks: list[Task], first_attempt: int = 0) -> CollectResult:
        """Async form of `collect`; `first_attempt` > 0 replays tasks whose earlier attempts were
        lost elsewhere (an env-manager process that died), with those attempts' retry budget spent."""
        unknown = sorted({t.tag for t in tasks} - set(self.tags))
        if unknown:  # a wiring bug, not an episode failure: fail loudly
            raise ValueError(f"tasks name tags {unknown} this collector has no env for; known: {sorted(self.tags)}")
        result = CollectResult([], episodes=len(tasks))
        outcomes = await asyncio.gather(*(self._episode(t, result, first_attempt) for t in tasks))
        failed_groups = {t.group_id for t, o in zip(tasks, outcomes) if o is None}
        kept = [o for t, o in zip(tasks, outcomes) if o is not None and t.group_id not in failed_groups]
        result.trajectories = [traj for episode in kept for traj in episode]
        result.segments = sum(len(episode) - 1 for episode in kept)
        result.failed_episodes = sum(o is None for o in outcomes)
        result.dropped_groups = len(failed_groups)
        return result

    async def _episode(self, task: Task, result: CollectResult, first_attempt: int = 0) -> list[Trajectory] | None:
        """The episode's trajectories (one, or one per segment), retrying failed attempts; None
        when every attempt failed."""
        for attempt in range(1, first_attempt):  # the sampling seeds the lost attempts used
            task = replace(task, sampling_seed=retry_seed(task.sampling_seed, attempt))
        for attempt in range(first_attempt, self.max_retries + 1):
            if attempt:
                result.retries += 1
                task = replace(task, sampling_seed=retry_seed(task.sampling_seed, attempt))
            try:
                if self.timeout is None:
                    return await self._attempt(task)
                return await asyncio.wait_for(self._attempt(task), self.timeout)
            except Exception as e:  # a crashed episode is recorded and retried, never fatal
                kind, message = classify(e, self.timeout)
                result.failures[kind] += 1
                where = f"tag {task.tag}, " if task.tag else ""
                result.errors.append(f"{kind}: {message} ({where}env seed {task.env_seed}, attempt {attempt + 1})")
        return None

    async def _attempt(self, task: Task) -> list[Trajectory]:
        # The env is built inside the attempt's own task (wait_for runs it in a new one), so
        # clients that map episodes to envs by asyncio task see the pairing they expect.
        spec = self.tags[task.tag]
        env = spec.env_factory()
        try:
            guarded = _GuardedEnv(env, bool(getattr(spec.agent, "per_answer_rewards", False)))
            out = await spec.agent.run_episode(task, guarded, self.llm)
            trajs = out if isinstance(out, list) else [out]  # a list: one sequence per segment
            # Set here, not by each agent: every agent's episodes carry what metrics and baselines read.
            for traj in trajs:
                traj.tag, traj.reset_info, traj.baseline = task.tag, guarded.reset_info, task.baseline
            return trajs
        finally:
            try:
                close = getattr(env, "close", None)  # optional: the seeds' envs have reset and step only
                if callable(close):
                    close()
            except Exception:  # closing a broken env must not hide the episode's own outcome
                pass


def classify(e: BaseException, timeout: float | None) -> tuple[str, str]:
    """(failure kind, one-line message) of an exception that ended an episode attempt."""
    if isinstance(e, EnvFailure):
        return "env", str(e)
    if isinstance(e, asyncio.TimeoutError):
        return "timeout", f"episode exceeded rollout.episode_timeout={timeout}s"
    if isinstance(e, EngineError):
        return "engine", _describe(e)
    return "agent", _describe(e)


def _describe(e: BaseException, where: str = "") -> str:
    last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}" if last else ""
    return f"{type(e).__name__}{' in ' + where if where else ''}: {e}{at}"
