"""Kubernetes Events, aggregated in memory (pure: no I/O, the clock is passed in).

What happened is recorded as an occurrence under a key (the object, the reason and what the
caller says makes two occurrences the same, e.g. the node group and the API's text). All
occurrences of one key are one core/v1 Event: its `count` is how often it happened, its
`lastTimestamp` and message the latest. A thousand refused placeholders are one Event with
count 1000, created once and then patched, never a thousand objects.

Writes go through a bounded queue of keys, each at most once in it however often it happens
meanwhile: a burst costs one write per key. When more keys wait than the queue holds, the
oldest is dropped (and counted); its tally stays, so its next occurrence writes the total.
Tallies are kept for the most recently seen keys only: an evicted key's next occurrence
starts a new Event.
"""

from __future__ import annotations

import dataclasses
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
    regarding: Regarding
    type: str
    reason: str
    message: str
    count: int
    first: float  # Unix time
    last: float
    # The Event object's name once created; None until then (and after it expired).
    name: str | None = None


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

    def take(self) -> Write | None:
        """The oldest waiting key's Event as it stands now, or None."""
        while self._pending:
            key, _ = self._pending.popitem(last=False)
            tally = self._tallies.get(key)
            if tally is not None:
                return Write(key, dataclasses.replace(tally))
        return None

    def written(self, write: Write, name: str | None) -> None:
        """The Event of `write.key` is now object `name` (None: it is gone, create anew)."""
        tally = self._tallies.get(write.key)
        if tally is not None:
            tally.name = name


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


def event_update(event: Tally) -> Obj:
    """The merge patch that brings the existing Event up to `event`."""
    return {
        "type": event.type,
        "message": event.message,
        "count": event.count,
        "lastTimestamp": _timestamp(event.last),
    }
