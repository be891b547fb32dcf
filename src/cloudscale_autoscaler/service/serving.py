"""Whether this replica serves the CloudProvider RPCs: the one gate for leader election.

Every path that answers CA consults it: the service (service/gate.py) and anything that
publishes state for a transport to answer from. Without leader election it is always open.
With it, the leader opens it after loading the inventory, and it closes on its own once the
last Lease renewal is older than the renew deadline: a leader that cannot renew stops serving
even if nothing else notices, before a standby may take the Lease.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Listener = Callable[[bool], None]
DeadlineListener = Callable[[float], None]


class Serving:
    def __init__(self, lease: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        # The Lease as "namespace/name", for messages; empty without leader election.
        self.lease = lease
        self._clock = clock
        self._until = math.inf if not lease else -math.inf
        self.leader: str | None = None  # the holder last seen, when that is not us
        # What the listeners last heard: the gate also shuts by itself at the renew deadline,
        # unheard, so they hear of that at the stand-by that follows.
        self._heard_open = not lease
        self._listeners: list[Listener] = []
        self._deadline_listeners: list[DeadlineListener] = []

    @property
    def until(self) -> float:
        """Serving until this time.monotonic() value (CLOCK_MONOTONIC on Linux): inf without
        leader election, -inf on a standby. Moves on with each Lease renewal, without an
        event: a transport answering from a snapshot compares it with its own clock."""
        return self._until

    @property
    def active(self) -> bool:
        return self._clock() < self._until

    def refusal(self) -> str | None:
        """None while serving, else why not (the message CA logs with UNAVAILABLE)."""
        if self._clock() < self._until:
            return None
        if self._until > -math.inf:
            return (
                f"this replica lost leadership (Lease {self.lease} not renewed in time) and "
                "no longer serves; retry against the current leader"
            )
        leader = f"the leader is {self.leader}" if self.leader else "no leader is known yet"
        return f"this replica is a standby (Lease {self.lease}): {leader}"

    def serve_until(self, deadline: float) -> None:
        """Open (or keep open) the gate until `deadline` on the serving clock."""
        self._until = deadline
        self.leader = None
        self._new_deadline()
        if self.active and not self._heard_open:
            log.info("serving the CloudProvider RPCs as leader (Lease %s)", self.lease)
            self._notify(True)

    def stand_by(self, leader: str | None) -> None:
        """Close the gate at once; `leader` is the holder, if known."""
        self._until = -math.inf
        self.leader = leader
        self._new_deadline()
        if self._heard_open:
            log.warning("stopped serving: standby now, leader %s", leader or "unknown")
            self._notify(False)

    def subscribe(self, listener: Listener) -> None:
        """Called with True when the gate opens and False at the stand-by after it was open
        (also when the renew deadline had shut it already): True and False alternate."""
        self._listeners.append(listener)

    def follow_deadline(self, listener: DeadlineListener) -> None:
        """Called with `until` whenever it is set (each Lease renewal, a stand-by): for a
        transport answering from a snapshot, which checks the deadline with its own clock."""
        self._deadline_listeners.append(listener)

    def _new_deadline(self) -> None:
        for listener in self._deadline_listeners:
            listener(self._until)

    def _notify(self, serving: bool) -> None:
        self._heard_open = serving
        for listener in self._listeners:
            listener(serving)
