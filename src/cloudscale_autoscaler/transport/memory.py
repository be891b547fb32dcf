"""Giving back to the system the memory a burst of requests made the process take.

glibc's malloc keeps what is freed for reuse: after large requests (up to the receive budget
of transport/limits.py, each copied and decoded by Python) the process would stay near its
peak RSS for good (141 MiB instead of 75 after the 16 MiB DeleteNodes flood of
tests/test_transport_limits.py). So every TRIM_INTERVAL_SECONDS, when the RSS is
TRIM_GROWTH_BYTES over the lowest seen after a trim, `malloc_trim` returns the free pages
inside the heaps; it costs a few milliseconds, in a worker thread, and is not tried while the
RSS stays near its low. Two arenas serve all threads, so the transport's threads do not each
keep a heap of their own. glibc's sliding mmap threshold is left alone: a fixed one kept the
RSS after a 20,000-server Refresh 40 MB higher (bench, workload e), and the trim already
returns what the large blocks freed.

Without glibc (musl, for one) there is nothing to tune and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from typing import Any

TRIM_INTERVAL_SECONDS = 15.0
TRIM_GROWTH_BYTES = 16 * 1024 * 1024
ARENA_MAX = 2
# mallopt's parameter (glibc's malloc.h).
_M_ARENA_MAX = -8
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _glibc() -> Any:
    path = ctypes.util.find_library("c")
    library = ctypes.CDLL(path) if path else None
    return library if library is not None and hasattr(library, "malloc_trim") else None


_LIBC = _glibc()


def tune_malloc() -> None:
    """Two arenas for all threads (see the module docstring)."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_ARENA_MAX, ARENA_MAX)


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


def _trim() -> int:
    _LIBC.malloc_trim(0)
    return rss_bytes()


async def trim_after_growth() -> None:
    """Runs until cancelled: trims whenever the RSS has grown (see the module docstring)."""
    if _LIBC is None:
        return
    low = rss_bytes()
    while True:
        await asyncio.sleep(TRIM_INTERVAL_SECONDS)
        if rss_bytes() > low + TRIM_GROWTH_BYTES:
            low = min(low, await asyncio.to_thread(_trim))
