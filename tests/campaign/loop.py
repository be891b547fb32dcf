"""An asyncio event loop on a background thread, for synchronous Hypothesis tests.

Hypothesis drives rules and examples synchronously; the provider under test is asyncio end to
end. One loop per test keeps the emulator, the gRPC server and their background tasks alive
between steps, so creations in flight keep progressing while Hypothesis picks the next rule,
as they would between two CA loops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# The longest any single step may take; it only turns a hang into a failure.
STEP_LIMIT_SECONDS = 120.0


class LoopThread:
    def __init__(self, name: str = "test-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], limit: float = STEP_LIMIT_SECONDS) -> T:
        """Run `coro` on the loop and wait for its result (exceptions propagate)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError(f"step did not finish within {limit} s (hang)") from None

    def close(self) -> None:
        if self.loop.is_running():
            self.run(cancel_others(), 30.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30.0)
        self.loop.close()


async def cancel_others() -> None:
    """Cancel every task of the running loop but the caller's, and wait for them to end."""
    current = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
