"""The engine's bookkeeping records: creations in flight, the batch an IncreaseSize started,
failed-creation placeholders, and a bounded memory of what was ours and is gone."""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict
from dataclasses import dataclass, field

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.engine.placement import Slot
from cloudscale_autoscaler.journal.entries import now_text

# CA's InstanceErrorClass values.
ERROR_CLASS_OUT_OF_RESOURCES = 1
ERROR_CLASS_OTHER = 99


class CreationState(enum.Enum):
    QUEUED = "queued"  # waiting for the concurrency bound; not sent, so still cancellable
    SENDING = "sending"  # the create request is out: past the point of no return
    ACKED = "acked"  # the API answered with the server's uuid; not yet seen in a listing


@dataclass(eq=False)
class Batch:
    """The creations one IncreaseSize started, so it can tell "all failed at once" apart."""

    size: int
    successes: int = 0
    failures: int = 0
    cancelled: int = 0
    # Sent, and no answer could tell whether the API carried them out: still counted, as
    # creates an earlier process recorded are, until listed or their bound passes.
    in_doubt: int = 0
    first_error: CloudError | None = None
    # The refusal that stopped the batch (quota, capacity, permanent): creates not yet sent
    # were recorded as failed with it instead of being sent.
    stopped_by: CloudError | None = None
    placeholder_ids: list[str] = field(default_factory=list)
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    # The creation journal's write of this batch; its creates are sent once it succeeded.
    recorded: asyncio.Future[None] | None = None

    def record(self) -> None:
        # Settled once the outcome is known: one success is enough to know not all failed.
        ended = self.successes + self.failures + self.cancelled + self.in_doubt
        if self.successes or ended >= self.size:
            self.settled.set()

    @property
    def all_failed(self) -> bool:
        done = self.failures + self.cancelled >= self.size
        return done and self.successes == 0 and self.failures > 0


@dataclass(eq=False)
class Creation:
    request_id: str
    name: str
    batch: Batch
    state: CreationState = CreationState.QUEUED
    uuid: str | None = None
    # Engine tick of the API's answer: a listing that started later and lacks the uuid
    # proves the server is gone.
    acked_tick: int = 0
    # When it was decided (wall clock, RFC 3339), as the creation journal records it.
    recorded_at: str = field(default_factory=now_text)
    # A create whose outcome is not known (an earlier process recorded it, or its answer never
    # came) and no listing has shown yet: counted until this time (monotonic), then taken for
    # never made (a failed placeholder).
    expires: float | None = None
    # The managed anti-affinity server group it goes into (antiAffinity groups only).
    slot: Slot | None = None


@dataclass(frozen=True)
class Placeholder:
    """A failed creation, shown to CA as an instance so it backs off and cleans up."""

    ident: str
    request_id: str
    code: str
    message: str
    error_class: int
    created: float  # monotonic seconds

    @staticmethod
    def from_error(ident: str, request_id: str, error: CloudError, now: float) -> Placeholder:
        error_class = ERROR_CLASS_OUT_OF_RESOURCES if error.out_of_resources else ERROR_CLASS_OTHER
        return Placeholder(ident, request_id, error.code, error.message, error_class, now)


class Recent:
    """A bounded set of ids, oldest forgotten first: what was ours and is gone, so a repeated
    DeleteNodes for it is an idempotent success instead of "not in this group"."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._items: OrderedDict[str, None] = OrderedDict()

    def add(self, item: str) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        return item in self._items
