"""Runs a step's episodes concurrently and returns their trajectories, group by group.

This is the seam between multi-turn rollout and training: everything after `collect` sees
only token sequences with a loss mask. Episodes run as asyncio tasks, each with its own env
instance; their engine requests meet in the engine's batches. Each task names its env
definition (its tag): the collector builds that tag's env and plays it with that tag's agent,
so one batch can mix FrozenLake, Sokoban and math.

Faults stay inside the episode they hit. An env or agent exception (SystemExit, KeyboardInterrupt
and other BaseExceptions of user code included), an engine error, a timeout (`timeout` seconds
per attempt) or a result the trainer cannot use (rollout/trajectory_check.py) ends that attempt
with its reason recorded; the episode is retried with a fresh env (same env seed, so it stays in
its group; a new sampling seed, so the retry is a new sample) up to `max_retries` times. When the
retries run out the whole group is dropped: a partial group would bias the group baseline. A
timeout can only interrupt an episode at an `await`: env work that may take long belongs off the
event loop (see envs/base.py).

`collect` runs the event loop in a thread of its own and watches it from the calling thread,
which so stays responsive to Ctrl-C and SIGTERM whatever the episodes do. With a timeout, a loop
that stops running (env code blocking it) for longer than the timeout is left behind and the
episode that blocked it fails as a timeout (`collect` says how); without one, a collection still
running after HANG_WARN_SECONDS gets a warning. On an interrupt the episodes' thread gets
STOP_SECONDS to stop before the interrupt goes on: a thread still inside torch when the
interpreter shuts down would abort the process (SIGABRT) instead of letting it exit.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from agentrl.envs.contract import reset_problem, step_problem
from agentrl.errors import EngineError, RolloutError, UserExit, as_failure, contained, must_propagate
from agentrl.rollout.loop_thread import LoopBlocked, LoopThread
from agentrl.rollout.stats import provenance_metrics
from agentrl.rollout.tasks import retry_seed
from agentrl.rollout.trajectory_check import episode_problem
from agentrl.trajectory import Task, Trajectory

if TYPE_CHECKING:  # types only: the collector imports the env contract's checks, never an env or agent
    from agentrl.agents.base import Agent
    from agentrl.envs.base import Env
    from agentrl.llm.engine import LLMClient

FAILURE_KINDS = ("env", "agent", "engine", "timeout", "worker")  # worker: the process playing it died (Ray)
# Why ids the engine decoded reach no loss (rollout/discarded_tokens/<cause>): a group the filters
# dropped (DAPO, RAGEN, on_truncation=drop, a surplus group), a group the stream dropped as too
# stale, a failed attempt or a group dropped for a failed episode, a request the engine aborted
# because its caller stopped waiting (an episode timeout). See docs/async-and-faults.md.
DISCARD_CAUSES = ("filtered", "stale", "failed", "aborted")


@dataclass
class TagSpec:
    """How episodes of one tag are played: a fresh env per episode, and the agent."""

    env_factory: Callable[[], Env]
    agent: Agent


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
    # Generated ids that reach no loss, per cause (DISCARD_CAUSES)
    discarded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DISCARD_CAUSES, 0))
    # Set by fill_step: generated ids of the groups handed to the trainer (those it drops later,
    # RAGEN's filter or on_truncation=drop, count as filtered) and the version trained on them
    handed_ids: int | None = None
    trained_version: int | None = None

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
        for cause, n in other.discarded.items():
            self.discarded[cause] = self.discarded.get(cause, 0) + n

    def discard(self, cause: str, ids: int) -> None:
        """Count `ids` generated ids that reach no loss, for `cause` (one of DISCARD_CAUSES)."""
        self.discarded[cause] = self.discarded.get(cause, 0) + int(ids)

    def metrics(self) -> dict[str, float]:
        """rollout/* counts of failures, retries, dropped groups, extra segments, discarded ids
        (rollout/discarded_tokens and one sub-key per cause) and the versions of the trained ids."""
        out = {f"rollout/failures_{kind}": float(n) for kind, n in self.failures.items()}
        out.update({"rollout/errors": float(len(self.errors)), "rollout/retries": float(self.retries),
                    "rollout/failed_episodes": float(self.failed_episodes),
                    "rollout/dropped_groups": float(self.dropped_groups), "rollout/segments": float(self.segments)})
        discarded = dict(self.discarded)
        if self.handed_ids is not None:  # the trainer's own filters ran after the source handed them over
            trained = sum(t.num_generated for t in self.trajectories)
            discarded["filtered"] = discarded.get("filtered", 0) + max(0, self.handed_ids - trained)
        out["rollout/discarded_tokens"] = float(sum(discarded.values()))
        out.update({f"rollout/discarded_tokens/{cause}": float(n) for cause, n in discarded.items()})
        out.update(provenance_metrics(self.trajectories, self.trained_version))
        return out


def check_failed(result: CollectResult, max_fraction: float, what: str, errors_at: str = "") -> None:
    """Stop with one line (RolloutError) when more than `max_fraction` of the collection's episodes
    failed every attempt, or every one of them did (nothing is left to train on): a broken env or
    agent, not bad luck. `errors_at` names the file that holds every error."""
    failed, n = result.failed_episodes, result.episodes
    if not failed or (failed <= max_fraction * n and failed < n):
        return
    why = (f"more than rollout.max_failed_fraction={max_fraction}" if failed > max_fraction * n
           else "every one of them")
    where = f"; all errors are in {errors_at}" if errors_at else ""
    first = result.errors[0] if result.errors else "none recorded"
    raise RolloutError(f"{what}: {failed} of {n} episodes failed every attempt ({why}); first error: {first}{where}")


class EnvFailure(Exception):
    """An exception raised inside the env's reset or step (as opposed to the agent's code)."""


class GuardedEnv:
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

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The env's `method`, its own exceptions raised as EnvFailure."""
        try:
            return await getattr(self._env, method)(*args, **kwargs)
        except BaseException as e:
            if must_propagate(e):  # a cancellation, a real Ctrl-C
                raise
            raise EnvFailure(_describe(e, method)) from e

    async def reset(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._call("reset", *args, **kwargs)
        self._check("reset", reset_problem(result, per_answer=self._per_answer))
        if not self._reset and isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
            self.reset_info = dict(result[1])
        self._reset = True
        return result

    async def step(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._call("step", *args, **kwargs)
        self._check("step", step_problem(result, strict=False, per_answer=self._per_answer))
        return result

    def _check(self, method: str, problem: tuple[str, str] | None) -> None:
        if problem is not None:
            raise EnvFailure(f"EnvError in {method}: {type(self._env).__name__}.{method}() {problem[1]}")


@dataclass
class _Episode:
    """One episode of a collection: its task, the attempt running (or next), what failed, what it gave."""

    task: Task
    attempt: int = 0
    errors: list[str] = field(default_factory=list)  # "kind: message (where, attempt k)"
    kinds: list[str] = field(default_factory=list)  # the failure kind of each error
    retries: int = 0
    out: list[Trajectory] | None = None
    done: bool = False
    lost_ids: int = 0  # ids the engine returned to its failed attempts

    def sampling_task(self) -> Task:
        """The task of the current attempt: the same env seed, a fresh sampling seed per retry."""
        task = self.task
        for attempt in range(1, self.attempt + 1):
            task = replace(task, sampling_seed=retry_seed(task.sampling_seed, attempt))
        return task

    def fail(self, kind: str, message: str, max_retries: int) -> None:
        """Record the current attempt's failure; move on to the next attempt, or give up."""
        where = f"tag {self.task.tag}, " if self.task.tag else ""
        self.errors.append(f"{kind}: {message} ({where}env seed {self.task.env_seed}, attempt {self.attempt + 1})")
        self.kinds.append(kind)
        self.attempt += 1
        if self.attempt > max_retries:
            self.done = True
        else:
            self.retries += 1


class RolloutCollector:
    """Plays many episodes at once, each with its tag's env and agent, through one engine.

    What an agent returns is checked before it is kept (rollout/trajectory_check.py): ids within
    `vocab_size`, finite logprobs, the engine's policy versions, the right types; anything else
    fails the episode as an agent error.
    """

    def __init__(self, tags: Mapping[str, TagSpec], llm: LLMClient, *,
                 timeout: float | None = None, max_retries: int = 0, vocab_size: int | None = None) -> None:
        if not tags:
            raise ValueError("RolloutCollector needs at least one tag")
        self.tags = dict(tags)
        self.llm = llm
        self.timeout = timeout
        self.max_retries = max_retries
        self.vocab_size = vocab_size  # token ids an agent returns must lie below it (None: unchecked)

    @classmethod
    def single(cls, env_factory: Callable[[], Env], agent: Agent, llm: LLMClient, tag: str = "",
               **kw: Any) -> RolloutCollector:
        """A collector of one env and one agent (tasks carry `tag`, "" by default)."""
        return cls({tag: TagSpec(env_factory, agent)}, llm, **kw)

    def collect(self, tasks: list[Task]) -> CollectResult:
        """Run every task to the end (blocking); keep only groups whose episodes all finished.

        The episodes run in an event loop on a thread of their own, watched from this one. A loop
        that env or agent code blocks past the episode timeout is left behind (its thread cannot
        be stopped): the episode that blocked it fails as a timeout, the others replay their
        current attempt in a fresh loop; after `max_retries + 1` such loops the collection stops
        with a RolloutError, since the env blocks systematically.
        """
        self._check_tags(tasks)
        episodes = [_Episode(t) for t in tasks]
        abandoned = 0
        while any(not ep.done for ep in episodes):
            index, blocked = self._round([ep for ep in episodes if not ep.done])
            if index is None:
                continue
            abandoned += 1
            # The blocked loop keeps its episodes: should the blocking call ever return, they
            # change those, not the copies the next loop plays (which replay their current attempt).
            episodes = [replace(ep, errors=list(ep.errors), kinds=list(ep.kinds)) for ep in episodes]
            culprit = [ep for ep in episodes if not ep.done][index]
            culprit.fail("timeout", f"the episode blocked the event loop for {blocked:.0f} s, longer than "
                         f"rollout.episode_timeout={self.timeout}s (synchronous work inside an async reset, step "
                         "or agent); run such work with `await asyncio.to_thread(...)`", self.max_retries)
            if abandoned > self.max_retries:
                last = culprit.errors[-1][culprit.errors[-1].rindex(" (") + 2:-1]  # tag, env seed, attempt
                raise LoopBlocked(f"the episodes' event loop was blocked {abandoned} times in one collection for "
                                  f"longer than rollout.episode_timeout={self.timeout}s (last: {last}): env or "
                                  "agent code blocks it with synchronous work inside an async reset/step; run such "
                                  "work with `await asyncio.to_thread(...)`", blocked)
        return self._result(episodes)

    def _round(self, todo: list[_Episode]) -> tuple[int | None, float]:
        """Play `todo` in a fresh loop on a thread of its own until all are done: (None, 0); or,
        when env code blocks the loop past the timeout, (the index in `todo` of the episode that
        blocked it, seconds blocked)."""
        owner: dict[asyncio.Task, _Episode] = {}  # every task of the loop -> the episode it serves

        async def play_all() -> None:
            asyncio.get_running_loop().set_task_factory(partial(_owned_task, owner))
            await asyncio.gather(*(self._owned_play(ep, owner) for ep in todo))

        thread = LoopThread(self.timeout, f"{len(todo)} episodes have been collecting")
        try:
            thread.run(play_all)
        except LoopBlocked as e:
            running = thread.running_task()
            culprit = owner.get(running) if running is not None else None
            if culprit is None:  # blocked outside any episode: nothing to blame, nothing to replay
                raise
            thread.abandon()  # should the blocking call ever return, its episodes stop there
            return next(i for i, ep in enumerate(todo) if ep is culprit), e.blocked
        return None, 0.0

    async def _owned_play(self, ep: _Episode, owner: dict[asyncio.Task, _Episode]) -> None:
        task = asyncio.current_task()
        assert task is not None  # gather runs each of play_all's coroutines in a task of its own
        owner[task] = ep
        await self._play(ep)

    def _check_tags(self, tasks: list[Task]) -> None:
        unknown = sorted({t.tag for t in tasks} - set(self.tags))
        if unknown:  # a wiring bug, not an episode failure: fail loudly
            raise ValueError(f"tasks name tags {unknown} this collector has no env for; known: {sorted(self.tags)}")

    async def acollect(self, tasks: list[Task], first_attempt: int = 0) -> CollectResult:
        """Async form of `collect`; `first_attempt` > 0 replays tasks whose earlier attempts were
        lost elsewhere (an env-manager process that died), with those attempts' retry budget spent."""
        self._check_tags(tasks)
        episodes = [_Episode(t, attempt=first_attempt, retries=int(first_attempt > 0)) for t in tasks]
        await asyncio.gather(*(self._play(ep) for ep in episodes))
        return self._result(episodes)

    def _result(self, episodes: list[_Episode]) -> CollectResult:
        """The collection's trajectories (whole groups only), counts and errors, in task order."""
        result = CollectResult([], episodes=len(episodes))
        failed_groups = {ep.task.group_id for ep in episodes if ep.out is None}
        kept = [ep.out for ep in episodes if ep.out is not None and ep.task.group_id not in failed_groups]
        result.trajectories = [traj for out in kept for traj in out]
        result.segments = sum(t.segment > 0 for out in kept for t in out)  # a game's seats are not segments
        result.failed_episodes = sum(ep.out is None for ep in episodes)
        result.dropped_groups = len(failed_groups)
        dropped = [ep.out for ep in episodes if ep.out is not None and ep.task.group_id in failed_groups]
        result.discard("failed", sum(ep.lost_ids for ep in episodes)
                       + sum(t.num_generated for out in dropped for t in out))
        for ep in episodes:
            result.errors += ep.errors
            result.retries += ep.retries
            for kind in ep.kinds:
                result.failures[kind] += 1
        return result

    async def _play(self, ep: _Episode) -> None:
        """Play the episode's attempts until one gives trajectories or the retries run out."""
        while not ep.done:
            llm = CountingClient(self.llm)
            out, failure = await guarded(self._attempt(ep.sampling_task(), llm), self.timeout)
            if failure is not None:  # a crashed episode is recorded and retried, never fatal
                ep.lost_ids += llm.decoded  # its replies reach no loss
                ep.fail(*failure, self.max_retries)
            else:
                ep.out, ep.done = out, True

    async def _attempt(self, task: Task, llm: LLMClient) -> list[Trajectory]:
        # The env is built inside the attempt's own task (wait_for runs it in a new one), so
        # clients that map episodes to envs by asyncio task see the pairing they expect.
        spec = self.tags[task.tag]
        env = spec.env_factory()
        versions = _engine_version(self.llm)
        try:
            guarded = GuardedEnv(env, bool(getattr(spec.agent, "per_answer_rewards", False)))
            out = await contained(spec.agent.run_episode(task, guarded, llm))  # its sys.exit fails it
            after = _engine_version(self.llm)
            span = (versions, after) if versions is not None and after is not None else None
            problem = episode_problem(out, task, self.vocab_size, span)
            if problem is not None:
                raise InvalidEpisode(f"{type(spec.agent).__name__}.run_episode {problem}")
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
            except BaseException as e:  # closing a broken env must not hide the episode's own outcome
                if must_propagate(e):
                    raise


class CountingClient:
    """The engine as one episode attempt sees it: every call passes through, and the ids of the
    replies it got are counted (a failed attempt's replies reach no loss: rollout/discarded_tokens)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.decoded = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        """The engine's completion of `prompt_ids`, its ids counted."""
        completion = await self._llm.generate(prompt_ids, sampling)
        self.decoded += len(getattr(completion, "token_ids", ()) or ())
        return completion


class InvalidEpisode(Exception):
    """An agent returned something the trainer cannot learn from (rollout/trajectory_check.py)."""


def _engine_version(llm: Any) -> int | None:
    """The policy version the engine serves now, when it says (an in-process or remote engine)."""
    version = getattr(llm, "policy_version", None)
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def _owned_task(owner: dict[asyncio.Task, Any], loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task:
    """A task factory: every task serves the episode its creator serves, so a loop found blocked
    can be blamed on the episode whose code blocks it."""
    task = asyncio.Task(coro, loop=loop, **kw)
    parent = asyncio.current_task(loop)
    if parent in owner:
        owner[task] = owner[parent]
    return task


async def guarded(coro: Coroutine, timeout: float | None) -> tuple[Any, tuple[str, str] | None]:
    """(result, None) of one episode attempt, or (None, (failure kind, one-line message)) when it
    raised (any BaseException of user code included) or ran past `timeout` seconds; asyncio's
    own cancellation and a real Ctrl-C propagate."""
    try:
        return (await (coro if timeout is None else asyncio.wait_for(coro, timeout))), None
    except BaseException as e:
        if must_propagate(e):  # a cancellation or a real Ctrl-C: stop
            raise
        return None, classify(as_failure(e), timeout)


def classify(e: BaseException, timeout: float | None) -> tuple[str, str]:
    """(failure kind, one-line message) of an exception that ended an episode attempt."""
    if isinstance(e, EnvFailure):
        return "env", str(e)
    if isinstance(e, asyncio.TimeoutError):
        return "timeout", f"episode exceeded rollout.episode_timeout={timeout}s"
    if isinstance(e, EngineError):
        return "engine", _describe(e)
    if isinstance(e, InvalidEpisode):
        return "agent", str(e)
    if isinstance(e, UserExit) and e.__cause__ is not None:
        return "agent", _describe(e.__cause__)
    return "agent", _describe(e)


def _describe(e: BaseException, where: str = "") -> str:
    """`Type in where: message at file:line` (the line where it was raised), on one line."""
    last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" at {last.filename.rsplit('/', 1)[-1]}:{last.lineno}" if last else ""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}{' in ' + where if where else ''}{': ' + text if text else ''}{at}"
