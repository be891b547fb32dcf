"""The emulator's in-memory store: servers with tag and server-group indexes, server groups,
pending deletions, the deletion log, request statistics, the fault set and the seeded RNG.

Everything here is synchronous and runs on the event loop, so no request can observe a
half-applied change.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from cloudscale_autoscaler.cloud.emulator.catalogue import SERVER_GROUPS
from cloudscale_autoscaler.cloud.emulator.faults import Faults
from cloudscale_autoscaler.cloud.emulator.records import ServerGroupRecord, ServerRecord
from cloudscale_autoscaler.cloud.emulator.validation import NewServer, NewServerGroup

TagFilter = tuple[str, str]  # (key, value); an empty value means "has the key"


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class _Index:
    """key -> insertion-ordered set of server uuids."""

    def __init__(self) -> None:
        self.members: dict[Any, dict[str, None]] = {}

    def add(self, key: Any, ident: str) -> None:
        self.members.setdefault(key, {})[ident] = None

    def discard(self, key: Any, ident: str) -> None:
        bucket = self.members.get(key)
        if bucket is not None:
            bucket.pop(ident, None)
            if not bucket:
                del self.members[key]

    def get(self, key: Any) -> dict[str, None]:
        return self.members.get(key, {})


class EmulatorState:
    def __init__(
        self,
        seed: int = 0,
        boot_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seed = seed
        self.boot_seconds = boot_seconds
        self.clock = clock
        self.base = "http://127.0.0.1/v1"  # replaced by Emulator.start with the real URL
        self.servers: dict[str, ServerRecord] = {}
        self.server_groups: dict[str, ServerGroupRecord] = {}  # in creation order
        # Server (and server group) uuids are deterministic too, and never repeat within one
        # emulator's life (reset does not rewind them: a client must never see a deleted uuid
        # come back).
        self._ids = random.Random(f"server-uuids:{seed}")
        self._group_ids = random.Random(f"server-group-uuids:{seed}")
        self._seq = itertools.count(1)
        self._by_tag = _Index()  # (key, value) -> uuids
        self._by_key = _Index()  # key -> uuids
        self._by_group = _Index()  # server group uuid -> uuids
        self._pending_deletes: list[tuple[float, str]] = []
        self.faults_changed = asyncio.Event()  # set (and replaced) whenever faults change
        # Requests per endpoint being handled right now (e.g. held by an injected latency).
        self.in_flight: dict[str, int] = {}
        # Changes being carried out whatever happens to their connection (Emulator.stop
        # cancels the ones still running).
        self.carried: set[asyncio.Future[Any]] = set()
        self.reset()

    def reset(self) -> None:
        """Forget servers, faults, logs and stats; rewind the fault RNG to the seed; back to the
        server groups of the start (SERVER_GROUPS, empty and untagged)."""
        for ident in list(self.servers):
            self._remove(ident)
        self._pending_deletes.clear()
        self.server_groups = {}
        for spec in SERVER_GROUPS.values():
            self._add_group(spec.uuid, spec.name, spec.zone, {})
        self.rng = random.Random(self.seed)
        # Fields of flavors changed by the admin API, by slug: what GET /v1/flavors answers.
        self.flavor_changes: dict[str, dict[str, Any]] = {}
        self.set_faults(Faults())
        self.deletions: list[dict[str, Any]] = []
        self.stats: dict[str, dict[str, int]] = {}

    def set_faults(self, faults: Faults) -> None:
        """Replace the fault set and wake requests sleeping in an injected latency, so they
        can see whether their endpoint is still delayed."""
        self.faults = faults
        self.faults_changed.set()
        self.faults_changed = asyncio.Event()

    # ---- reads ---------------------------------------------------------------------------

    def render(self, record: ServerRecord, status: str | None = None) -> bytes:
        return record.json_bytes(status or record.status(self.clock()), self.base)

    def render_list(self, records: Iterable[ServerRecord]) -> bytes:
        now = self.clock()
        base = self.base
        return b"[" + b",".join(r.json_bytes(r.status(now), base) for r in records) + b"]"

    def matching(self, filters: list[TagFilter]) -> list[ServerRecord]:
        """Servers carrying every filter's tag (ANDed), in creation order."""
        if not filters:
            return list(self.servers.values())
        buckets = [self._by_tag.get(f) if f[1] else self._by_key.get(f[0]) for f in filters]
        smallest = min(buckets, key=len)
        records = [self.servers[ident] for ident in smallest]
        if len(filters) > 1:
            records = [r for r in records if all(_has_tag(r.tags, f) for f in filters)]
        records.sort(key=lambda r: r.seq)
        return records

    def group_members(self, group_uuid: str) -> list[ServerRecord]:
        """A server group's servers in creation order, including ones whose deletion still
        lingers (they occupy their host until they are gone)."""
        return [self.servers[ident] for ident in self._by_group.get(group_uuid)]

    def member_count(self, group_uuid: str) -> int:
        return len(self._by_group.get(group_uuid))

    def server_group(self, uuid: str) -> ServerGroupRecord | None:
        return self.server_groups.get(uuid)

    def matching_groups(self, filters: list[TagFilter]) -> list[ServerGroupRecord]:
        """Server groups carrying every filter's tag (ANDed, as for servers), in creation
        order. Groups are few: a plain scan."""
        return [
            group
            for group in self.server_groups.values()
            if all(_has_tag(group.tags, f) for f in filters)
        ]

    def render_group(self, group: ServerGroupRecord) -> dict[str, Any]:
        return group.to_json(self.base, self.group_members(group.uuid))

    def vcpus_in_use(self) -> int:
        return sum(r.flavor.vcpu_count for r in self.servers.values())

    # ---- writes --------------------------------------------------------------------------

    def create(self, new: NewServer, created_at: str | None = None) -> ServerRecord:
        ident = str(uuid.UUID(int=self._ids.getrandbits(128), version=4))
        record = ServerRecord(
            uuid=ident,
            seq=next(self._seq),
            name=new.name,
            zone=new.zone,
            flavor=new.flavor,
            image=new.image,
            created_at=created_at or utc_now_iso(),
            ready_at=self.clock() + self.boot_seconds,
            volume_size_gb=new.volume_size_gb,
            use_public_network=new.use_public_network,
            use_private_network=new.use_private_network,
            use_ipv6=new.use_ipv6,
            interfaces=new.interfaces,
            ssh_keys=new.ssh_keys,
            server_groups=new.server_groups,
            tags=dict(new.tags),
            user_data=new.user_data,
            fixed_status=new.status,
        )
        self.servers[ident] = record
        self._index_tags(record)
        for group in record.server_groups:
            self._by_group.add(group.uuid, ident)
        return record

    def populate(self, count: int, template: NewServer) -> list[str]:
        created_at = utc_now_iso()
        prefix = template.name
        uuids = []
        for _ in range(count):
            record = self.create(template, created_at)
            # Renaming before anyone could have rendered it needs no touch().
            record.name = f"{prefix}-{record.seq}"
            uuids.append(record.uuid)
        return uuids

    def create_group(self, new: NewServerGroup) -> ServerGroupRecord:
        ident = str(uuid.UUID(int=self._group_ids.getrandbits(128), version=4))
        return self._add_group(ident, new.name, new.zone, new.tags)

    def rename_group(self, group: ServerGroupRecord, name: str) -> None:
        group.name = name
        for member in self.group_members(group.uuid):  # they show the group's name
            member.touch()

    def delete_group(self, ident: str) -> int | None:
        """Delete an empty server group: None if there is no such group, else the number of
        servers it still has (0: deleted; more: refused, nothing changed)."""
        if ident not in self.server_groups:
            return None
        members = self.member_count(ident)
        if not members:
            del self.server_groups[ident]
        return members

    def set_tags(self, record: ServerRecord, tags: dict[str, str]) -> None:
        self._unindex_tags(record)
        record.tags = dict(tags)
        self._index_tags(record)
        record.touch()

    def rename(self, record: ServerRecord, name: str) -> None:
        record.name = name
        record.touch()

    def delete(self, ident: str, by: str, linger_seconds: float = 0.0) -> bool:
        """Delete a server and log it. With linger_seconds it stays listed ("changing") that
        long. Deleting a lingering server again succeeds without a second log entry (and ends
        the lingering when linger_seconds is 0)."""
        record = self.servers.get(ident)
        if record is None:
            return False
        if record.deleting_until is not None:  # already deleted (and logged), still lingering
            if not linger_seconds:
                self._remove(ident)
            return True
        self.deletions.append(
            {
                "uuid": ident,
                "name": record.name,
                "tags": dict(record.tags),
                "by": by,
                "at": utc_now_iso(),
            }
        )
        if linger_seconds > 0:
            record.deleting_until = self.clock() + linger_seconds
            record.touch()
            heapq.heappush(self._pending_deletes, (record.deleting_until, ident))
        else:
            self._remove(ident)
        return True

    def purge(self) -> None:
        """Drop servers whose lingering deletion has run out."""
        now = self.clock()
        while self._pending_deletes and self._pending_deletes[0][0] <= now:
            until, ident = heapq.heappop(self._pending_deletes)
            record = self.servers.get(ident)
            if record is not None and record.deleting_until == until:
                self._remove(ident)

    def record_request(self, endpoint: str, status: str) -> None:
        per_status = self.stats.setdefault(endpoint, {})
        per_status[status] = per_status.get(status, 0) + 1

    def _remove(self, ident: str) -> None:
        record = self.servers.pop(ident)
        self._unindex_tags(record)
        for group in record.server_groups:
            self._by_group.discard(group.uuid, ident)

    def _add_group(
        self, ident: str, name: str, zone: str, tags: dict[str, str]
    ) -> ServerGroupRecord:
        group = ServerGroupRecord(ident, name, zone, dict(tags))
        self.server_groups[ident] = group
        return group

    def _index_tags(self, record: ServerRecord) -> None:
        for item in record.tags.items():
            self._by_tag.add(item, record.uuid)
            self._by_key.add(item[0], record.uuid)

    def _unindex_tags(self, record: ServerRecord) -> None:
        for item in record.tags.items():
            self._by_tag.discard(item, record.uuid)
            self._by_key.discard(item[0], record.uuid)


def _has_tag(tags: dict[str, str], tag: TagFilter) -> bool:
    key, value = tag
    return tags.get(key) == value if value else key in tags
