"""The engine's background work: listings, creations and deletions that outlive the call
that started them.

Owns the set of tasks still running (so shutdown can wait for them, and none is collected
while it runs), the shutting-down flag, and `on_change`: called when a task finished and
may have changed the state; changes made inside an RPC are published by the transport
after the call. Runs on the asyncio loop only; nothing here awaits except `drain`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        # Set at shutdown: no new creations, no resumed deletions.
        self.closing = False
        self.on_change: Callable[[], None] = lambda: None

    def track(self, task: asyncio.Task[None]) -> None:
        """Hold `task` until it ends, so shutdown waits for it."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `coro` as a tracked task that publishes the state when it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self.track(task)
        task.add_done_callback(lambda _: self.on_change())
        return task

    async def drain(self, grace_seconds: float) -> None:
        """Give the tasks still running `grace_seconds` to finish, then cancel the rest."""
        pending = [task for task in self._tasks if not task.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace_seconds)
            for task in late:
                task.cancel()
            if late:
                log.warning("shutdown: abandoned %d cloud request(s) still in flight", len(late))
                await asyncio.wait(late)
