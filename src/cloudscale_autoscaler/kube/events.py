"""Kubernetes Events, aggregated in memory (pure: no I/O, the clock is passed in).

What happened is recorded as an occurrence under a key (the object, the reason and what the
caller says makes two occurrences the same, e.g. the node group and the API's text). The
provider may only create Events, never change one (an account that may patch Events may patch
every Event of the namespace, and Event names cannot be foreseen), so occurrences of a key are
counted into new Events: each carries how often it happened since the key's previous Event
(`count`), from when (`firstTimestamp`) to when (`lastTimestamp`), and the latest message. A
thousand refused placeholders of one scale-up are one Event with count 1000; the same key gets
at most one new Event per REPEAT_SECONDS, however often it happens meanwhile.

Writes go through a bounded queue of keys, each at most once in it: a burst costs one write per
key. When more keys wait than the queue holds, the oldest is dropped (and counted); its
occurrences stay counted, so its next occurrence writes them too. Tallies are kept for the most
recently seen keys only: an evicted key's next occurrence starts from scratch.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime

from cloudscale_autoscaler.kube.api import Obj

NORMAL = "Normal"
WARNING = "Warning"
COMPONENT = "cloudscale-autoscaler"
# The API server refuses longer messages (events.k8s.io's note limit).
MESSAGE_LIMIT = 1024
INSTANCE_LIMIT = 128
# Events about cluster-scoped objects (Nodes) live here, as the kubelet's do.
CLUSTER_SCOPED_NAMESPACE = "default"
QUEUE_LIMIT = 256
TALLY_LIMIT = 1024
# A key's Events at most this often: repeats in between are counted into its next Event.
REPEAT_SECONDS = 10.0


@dataclass(frozen=True)
class Regarding:
    """The object an Event is about: the provider's own Pod, or a Node (namespace "")."""

    kind: str
    name: str
    namespace: str = ""
    # `kubectl describe` selects events by uid; for a Node the kubelet's convention (its name)
    # matches too.
    uid: str = ""

    @property
    def event_namespace(self) -> str:
        return self.namespace or CLUSTER_SCOPED_NAMESPACE

    def reference(self) -> Obj:
        ref: Obj = {"apiVersion": "v1", "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


Key = tuple[Regarding, str, str]  # (object, reason, what makes occurrences the same)


@dataclass
class Tally:
    """A key's occurrences not written yet (`count` from `first` to `last`), and when its last
    Event was written."""

    regarding: Regarding
    type: str
    reason: str
    message: str
    count: int
    first: float  # Unix time
    last: float
    written_at: float = -math.inf


@dataclass(frozen=True)
class Write:
    """What one write sends: a copy of the key's tally (it may change while the write is out)."""

    key: Key
    event: Tally


class Aggregator:
    def __init__(self, queue_limit: int = QUEUE_LIMIT, tally_limit: int = TALLY_LIMIT) -> None:
        self._queue_limit = queue_limit
        self._tally_limit = tally_limit
        self._tallies: OrderedDict[Key, Tally] = OrderedDict()  # least recently seen first
        self._pending: OrderedDict[Key, None] = OrderedDict()  # oldest first
        self.dropped = 0  # keys dropped from the full queue

    def record(
        self,
        regarding: Regarding,
        type_: str,
        reason: str,
        message: str,
        now: float,
        same: str | None = None,
    ) -> None:
        """One occurrence; `same` (default: the message) tells which occurrences are one
        Event, the latest message is shown."""
        key = (regarding, reason, message if same is None else same)
        message = message[:MESSAGE_LIMIT]
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = Tally(regarding, type_, reason, message, 0, now, now)
        else:
            self._tallies.move_to_end(key)
        if tally.count == 0:  # the first since its last Event
            tally.first = now
        tally.count += 1
        tally.last, tally.message, tally.type = now, message, type_
        if key not in self._pending:
            if len(self._pending) >= self._queue_limit:
                self._pending.popitem(last=False)
                self.dropped += 1
            self._pending[key] = None
        self._evict()  # after queueing: never the tally just recorded

    def _evict(self) -> None:
        """Forget the least recently seen tallies beyond the limit, except those waiting."""
        excess = len(self._tallies) - self._tally_limit
        if excess <= 0:
            return
        idle: list[Key] = []
        for key in self._tallies:  # from the front: stops after at most the waiting ones
            if key not in self._pending:
                idle.append(key)
                if len(idle) == excess:
                    break
        for key in idle:
            del self._tallies[key]

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def _due(self, tally: Tally) -> float:
        return tally.written_at + REPEAT_SECONDS

    def take(self, now: float) -> Write | None:
        """The oldest waiting key whose next Event is due, with its occurrences (the tally
        starts counting anew), or None; keys not due yet keep waiting."""
        for key in list(self._pending):
            tally = self._tallies.get(key)
            if tally is None or tally.count == 0:
                del self._pending[key]
            elif self._due(tally) <= now:
                del self._pending[key]
                write = Write(key, dataclasses.replace(tally))
                tally.count = 0
                return write
        return None

    def next_due(self, now: float) -> float | None:
        """Seconds until the next waiting key is due (0: now), None when none waits."""
        dues = [self._due(t) for key in self._pending if (t := self._tallies.get(key))]
        return max(0.0, min(dues) - now) if dues else None

    def written(self, write: Write, now: float) -> None:
        """`write`'s Event was created: the key's next one is due REPEAT_SECONDS from now."""
        tally = self._tallies.get(write.key)
        if tally is not None:
            tally.written_at = now

    def failed(self, write: Write) -> None:
        """`write`'s Event was not created: its occurrences count again, into the key's
        next Event (written at its next occurrence)."""
        tally = self._tallies.get(write.key)
        if tally is not None:
            if tally.count:
                tally.first = write.event.first
            else:
                tally.first, tally.last = write.event.first, write.event.last
            tally.count += write.event.count


def event_name(regarding: Regarding, now_ns: int | None = None) -> str:
    """A new Event's name, as client-go makes them: the object's name and the time in hex."""
    return f"{regarding.name}.{now_ns if now_ns is not None else time.time_ns():x}"


def _timestamp(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_event(event: Tally, name: str, instance: str) -> Obj:
    """The core/v1 Event to create; `instance` names this replica (its Pod)."""
    regarding = event.regarding
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": regarding.event_namespace},
        "involvedObject": regarding.reference(),
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "count": event.count,
        "firstTimestamp": _timestamp(event.first),
        "lastTimestamp": _timestamp(event.last),
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:INSTANCE_LIMIT],
    }
