"""Refused TLS handshakes, logged: who and why, at most one line per client address per window.

A client without a certificate, with one the client CA did not sign, or speaking plain HTTP
is refused during the handshake, before any RPC: the transport reports each refusal here
(from its own thread). A misconfigured client retries every few seconds, so the lines are
rate-limited per address (the host, not the port: each retry comes from a new port); the
next line after a quiet window says how many refusals it stood for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 60.0


def _host(peer: str) -> str:
    """The host of "127.0.0.1:5000" or "[::1]:5000", without the port."""
    host = peer.rpartition(":")[0] or peer
    return host.removeprefix("[").removesuffix("]")


class RefusedHandshakes:
    """`refused(peer, reason)` logs a warning unless `peer`'s host was logged within `window`
    seconds; then it only counts."""

    def __init__(
        self, window: float = DEFAULT_WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()  # called from the transport's thread
        # host -> (when its last line was logged, refusals since then not logged)
        self._hosts: dict[str, tuple[float, int]] = {}

    def refused(self, peer: str, reason: str) -> None:
        now = self._clock()
        host = _host(peer)
        with self._lock:
            logged_at, quiet = self._hosts.get(host, (-float("inf"), 0))
            if now - logged_at < self._window:
                self._hosts[host] = (logged_at, quiet + 1)
                return
            self._forget_before(now - self._window)
            self._hosts[host] = (now, 0)
        extra: dict[str, object] = {"peer": peer, "reason": reason}
        if quiet:
            extra["refused_since_last_line"] = quiet
        log.warning("TLS handshake refused", extra=extra)

    def _forget_before(self, moment: float) -> None:
        # A host logged before `moment` whose refusals were all logged needs no entry: the
        # table holds the recent hosts and those with a count still to tell.
        for host in [h for h, (at, quiet) in self._hosts.items() if at < moment and not quiet]:
            del self._hosts[host]
