"""Virtual time for the seams campaign, and who owns which task.

The campaign's event loop is looptime's, with its clock always virtual: while a step runs
(`run`), the clock jumps to the next timer whenever nothing is ready and no socket has data,
so a Lease's 15 s, a client's 30 s timeout or a 60 s bound pass in microseconds; between
steps the loop does not run at all, so no time passes there. Everything runs on that one loop,
in the test's thread: the emulator, the replicas and the HTTP between them (loopback sockets,
read at once), so an exchange is never cut by a jump.

Work handed to a thread (a config file read) runs at once in the loop's thread instead
(InlineExecutor), and every random choice of the provider draws from `random`, seeded per
schedule: so a schedule replays alike, and Hypothesis can shrink a failing one.

Every task knows the replica that created it (OWNER, inherited by the tasks it creates), so a
replica can be killed as SIGKILL kills a process: its tasks cancelled, wherever they were (its
connections are cut first, so nothing it does while dying reaches anyone).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

import looptime

from campaign.loop import cancel_others

T = TypeVar("T")

# The replica a task works for; None: the campaign's own (the emulator, the checks).
OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("owner", default=None)
# Virtual seconds the clock moves per real step while a thread works for the loop.
IDLE_STEP = 0.005
# The most virtual time one step may take; it only turns a hang into a failure.
STEP_LIMIT_SECONDS = 3600.0


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs what is submitted at once, in the caller's thread: a thread's real time would
    move the virtual clock by however long it took. (A ThreadPoolExecutor only because
    asyncio takes no other default executor; it starts no thread.)"""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:
            future.set_exception(error)
        return future


class VirtualLoop:
    """A looptime event loop, run step by step in the calling thread."""

    def __init__(self) -> None:
        self.loop = looptime.new_event_loop(idle_step=IDLE_STEP)
        self.loop.set_task_factory(self._task)  # type: ignore[arg-type]
        self.loop.set_default_executor(InlineExecutor())
        # Tasks by owner, in the order they were made (cancelled in that order).
        self._owned: dict[str, list[asyncio.Task[Any]]] = {}

    def _task(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any],
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, context=context)
        owner = (context or contextvars.copy_context()).get(OWNER)
        if owner is not None:
            self._owned.setdefault(owner, []).append(task)
        return task

    def owned(self, owner: str) -> list[asyncio.Task[Any]]:
        """The tasks of `owner` still running (the ended ones are forgotten here)."""
        running = [task for task in self._owned.get(owner, ()) if not task.done()]
        self._owned[owner] = running
        return running

    def run(self, coro: Coroutine[Any, Any, T], limit: float = STEP_LIMIT_SECONDS) -> T:
        """Run `coro` to its end (everything else on the loop runs meanwhile)."""
        return self.loop.run_until_complete(self._bounded(coro, limit))

    async def _bounded(self, coro: Coroutine[Any, Any, T], limit: float) -> T:
        try:
            return await asyncio.wait_for(coro, limit)
        except TimeoutError:
            raise AssertionError(f"step did not end within {limit:g} s of virtual time") from None

    def close(self) -> None:
        self.loop.run_until_complete(cancel_others())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
