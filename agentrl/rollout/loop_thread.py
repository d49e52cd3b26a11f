"""An event loop on a thread of its own, watched from the calling thread.

Episodes run user code (envs, agents) that may block its event loop with synchronous work, or
await forever. The calling thread only waits and watches, so it stays free to take a Ctrl-C or
a SIGTERM whatever the episodes do. `LoopWatch` tells a loop that stopped running (LoopBlocked,
once it has not run for longer than the episode timeout) and, without a timeout, warns once
about a long wait. `LoopThread` runs one coroutine that way; on an interrupt it asks the loop to
cancel its work and gives the thread STOP_SECONDS to end before the interrupt goes on: a thread
still inside torch when the interpreter shuts down is ended by a forced unwind that C++ turns
into `terminate called without an active exception` (SIGABRT, exit 134) instead of a clean exit.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from agentrl.errors import RolloutError

WATCH_SECONDS = 1.0  # how often the calling thread checks on the episodes' event loop
HANG_WARN_SECONDS = 600.0  # without an episode timeout, warn once when a collection runs this long
STOP_SECONDS = 10.0  # on an interrupt, how long the loop's thread gets to stop before the caller goes on


def warn_hang(message: str) -> None:
    """Tell the user a collection may hang (stderr, where the CLI writes its log)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


class LoopBlocked(RolloutError):
    """The episodes' event loop has not run for longer than the episode timeout: env or agent
    code blocks it with synchronous work."""

    def __init__(self, message: str, blocked: float) -> None:
        super().__init__(message)
        self.blocked = blocked  # seconds the loop had not run


class LoopWatch:
    """Watches an event loop that runs episodes from another thread: `check` raises LoopBlocked
    once the loop has not run for longer than the episode timeout (env code blocking it), and
    without a timeout warns once after HANG_WARN_SECONDS."""

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
                raise LoopBlocked(
                    f"the episodes' event loop has not run for {blocked:.0f} s, longer than "
                    f"rollout.episode_timeout={self.timeout}s: env or agent code blocks it (synchronous "
                    "work inside an async reset/step); run such work with `await asyncio.to_thread(...)`", blocked)
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


class LoopThread:
    """Runs one coroutine in a fresh event loop on a daemon thread and waits for it, watching.

    `run` returns the coroutine's result or raises its exception; LoopBlocked when the loop is
    blocked past `timeout` (the loop is left as it is: `running_task` tells what blocks it,
    `abandon` asks it to stop should it ever run again); an interrupt cancels the coroutine and
    waits up to STOP_SECONDS for the thread to end before it propagates.
    """

    def __init__(self, timeout: float | None, waiting: str) -> None:
        self.timeout = timeout
        self.waiting = waiting
        self.loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None
        self._done = threading.Event()
        self._box: dict[str, Any] = {}
        self._abandoned = False

    def run(self, make: Callable[[], Coroutine]) -> Any:
        """Run `make()` to its end in the thread's loop; its result."""
        async def main() -> Any:
            self.loop, self._main = asyncio.get_running_loop(), asyncio.current_task()
            if self._abandoned:  # interrupted before the loop ran: start nothing (abandon saw no task)
                raise asyncio.CancelledError
            return await make()

        def target() -> None:
            try:
                self._box["result"] = asyncio.run(main())
            except BaseException as e:  # handed to the calling thread
                self._box["error"] = e
            finally:
                self._done.set()

        # A daemon thread: code blocked for good must not keep the process alive after an interrupt.
        threading.Thread(target=target, name="agentrl-collect", daemon=True).start()
        watch = LoopWatch(self.timeout, self.waiting)
        try:
            while not self._done.wait(WATCH_SECONDS):
                watch.check(self.loop)
        except LoopBlocked:
            raise
        except BaseException:
            self.abandon()
            self._done.wait(STOP_SECONDS)  # the interrupt ends the process next: let torch calls return
            raise
        error = self._box.get("error")
        if isinstance(error, (KeyboardInterrupt, SystemExit)):  # signals reach the main thread, not this one
            raise RolloutError(f"env or agent code raised {type(error).__name__} in an asyncio task of its own, "
                               "which ended the collection; raise an Exception there instead") from None
        if error is not None:
            raise error
        return self._box.get("result")

    def running_task(self) -> asyncio.Task | None:
        """The task the (blocked) loop runs now, read from the watching thread."""
        if self.loop is None:
            return None
        try:
            return asyncio.current_task(self.loop)
        except RuntimeError:
            return None

    def abandon(self) -> None:
        """Ask the loop to cancel its coroutine at its next turn (or not to start it)."""
        self._abandoned = True
        if self.loop is not None and self._main is not None and not self._main.done():
            try:
                self.loop.call_soon_threadsafe(self._main.cancel)
            except RuntimeError:  # the loop closed meanwhile
                pass
