"""Client-side request pacing and backoff arithmetic."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime


class TokenBucket:
    """An async token bucket: `rate` tokens per second, bursts of up to `burst`.

    Fair: waiters are served strictly in arrival order, because the one waiting for the next
    token holds an asyncio.Lock (FIFO) while it sleeps, and everyone else queues behind it.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 requests per second, got {rate!r}")
        self.rate = rate
        # One second's worth by default, and at least one token or nothing could ever pass.
        self.capacity = max(1.0, rate if burst is None else burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.capacity
        self._updated = clock()
        self._lock = asyncio.Lock()
        # How many acquisitions had to wait: makes the limit observable (tests, metrics).
        self.waits = 0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._updated) * self.rate)
        self._updated = now

    async def acquire(self) -> None:
        async with self._lock:
            self._refill()
            if self._tokens < 1.0:
                self.waits += 1
                await self._sleep((1.0 - self._tokens) / self.rate)
                self._refill()
            # May dip marginally below zero through float rounding; the next waiter then
            # simply waits that much longer, which keeps the long-run rate exact.
            self._tokens -= 1.0


def backoff_delay(
    retry: int, base: float, cap: float, rng: random.Random, retry_after: float | None = None
) -> float:
    """Full-jitter exponential backoff for the `retry`-th retry (1-based).

    A server's Retry-After is a floor (retrying sooner would just be refused again); both are
    capped so a hostile or broken header cannot stall us indefinitely.
    """
    ceiling = min(cap, base * (2 ** (retry - 1)))
    delay = rng.uniform(0.0, ceiling)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, cap)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: either delta-seconds or an HTTP date; None when absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


class ConcurrencyLimit:
    """A semaphore that also reports how many holders it has and had at most (a gauge for
    metrics, and the observable proof that the bound holds)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.limit = limit
        self._semaphore = asyncio.Semaphore(limit)
        self.in_flight = 0
        self.peak = 0

    async def __aenter__(self) -> None:
        await self._semaphore.acquire()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    async def __aexit__(self, *exc_info: object) -> None:
        self.in_flight -= 1
        self._semaphore.release()
