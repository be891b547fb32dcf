"""Anti-affinity server groups the provider manages for a node group (`antiAffinity: true`).

cloudscale.ch keeps the members of an anti-affinity server group on distinct hosts, at most
MAX_MEMBERS per group, in one zone; a server joins one only in its create request. For a group
with antiAffinity the provider makes such server groups itself, tagged with the cluster, the
node group and TAG_MANAGED, so a listing finds them again (after a restart too).

Owns, per node group, the managed server groups as the last listing showed them, the ones being
created, those being deleted, and those a create found full. Which creation goes where is on
the creation itself (Creation.slot); a server group's room is derived, never stored:

    room = MAX_MEMBERS - members listed - creations placed there and not yet listed as members

- Placing (synchronous, inside IncreaseSize, so creations never race into one group): each new
  creation goes into the fullest server group with room, so each fills up before the next is
  used; the rest go into new server groups, MAX_MEMBERS each, created before their creations
  are sent.
- After each listing, a managed server group with no member and nothing placed in it is deleted
  (only ours: both tags and TAG_MANAGED) once it has been seen empty for `grace` seconds (the
  journal's adoption bound: a create sent by an earlier process and not recorded, or not yet
  carried out, may still be joining it), and never while creates of unknown outcome are
  counted for its node group. Managed server groups of a node group that no longer manages any
  (removed by a reload, renamed, antiAffinity turned off) are tidied the same way and reported.
- A listing is applied over what the provider itself did after that listing began: server
  groups it created or deleted since stay created or deleted (an older listing never undoes
  them).
- Refusals reach CA as failed creates, with the class creations.py gives any CloudError: a full
  group (our count was stale; it is not used again until the next listing) and a group gone
  (dropped) are Other; no distinct host left is OutOfResources.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cloudscale_autoscaler.cloud.errors import (
    CloudError,
    ServerGroupFullError,
    ServerGroupGoneError,
)
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP, TAG_MANAGED, ServerGroup
from cloudscale_autoscaler.cloud.protocol import Cloud, Fence
from cloudscale_autoscaler.engine import names
from cloudscale_autoscaler.engine.background import Background

log = logging.getLogger(__name__)

# The API's limit on the members of one anti-affinity server group.
MAX_MEMBERS = 4
MANAGED = "true"


@dataclass(eq=False)
class PendingGroup:
    """A server group being created for creations placed in it."""

    name: str
    created: asyncio.Future[str] = field(default_factory=asyncio.Future)


@dataclass(eq=False)
class Slot:
    """Where one creation goes: a known server group, or one being created."""

    uuid: str | None = None
    pending: PendingGroup | None = None

    async def resolve(self) -> str:
        """The server group's uuid, once it exists; its creation's error otherwise."""
        if self.uuid is None:
            assert self.pending is not None
            self.uuid = await asyncio.shield(self.pending.created)
        return self.uuid

    @property
    def target(self) -> str | PendingGroup | None:
        """The server group's uuid if known by now, else the one being created (None: its
        creation failed)."""
        if self.uuid is not None or self.pending is None:
            return self.uuid
        created = self.pending.created
        if not created.done():
            return self.pending
        return None if created.exception() else created.result()


# Creations placed per server group: by uuid, or the PendingGroup being created.
Placed = dict[str | PendingGroup, int]


def _slot(target: str | PendingGroup) -> Slot:
    return Slot(pending=target) if isinstance(target, PendingGroup) else Slot(uuid=target)


@dataclass
class Placement:
    """One node group's managed server groups (state only; ServerGroups acts on it)."""

    zone: str | None
    known: dict[str, ServerGroup] = field(default_factory=dict)  # uuid -> as last listed
    pending: list[PendingGroup] = field(default_factory=list)
    deleting: set[str] = field(default_factory=set)
    full: set[str] = field(default_factory=set)  # refused as full since the last listing
    # Our own creates (the group) and deletes (None) by uuid, with the engine tick they
    # happened at: a listing begun before them does not undo them.
    changes: dict[str, tuple[int, ServerGroup | None]] = field(default_factory=dict)
    # When each known server group was first seen with no member and nothing placed (clock).
    empty_since: dict[str, float] = field(default_factory=dict)

    @property
    def count(self) -> int:
        """Server groups the node group holds: listed or being created."""
        return len(self.known) + len(self.pending)

    def apply_listing(self, listed: Iterable[ServerGroup], start_tick: int) -> None:
        """The server groups a listing begun at `start_tick` showed, over our own changes
        made since."""
        known = {group.uuid: group for group in listed}
        for uuid, (tick, made) in list(self.changes.items()):
            if tick <= start_tick:
                del self.changes[uuid]  # the listing saw it
            elif made is None:
                known.pop(uuid, None)
            else:
                known[uuid] = made
        self.known = known
        self.full.clear()
        self.deleting &= self.known.keys()

    def made(self, group: ServerGroup, tick: int) -> None:
        self.known[group.uuid] = group
        self.changes[group.uuid] = (tick, group)

    def gone(self, uuid: str, tick: int) -> None:
        self.known.pop(uuid, None)
        self.changes[uuid] = (tick, None)

    def placed(self, slots: Iterable[tuple[Slot, str | None]]) -> Placed:
        """Creations placed per server group (known, or being created) and not yet listed as
        its members, from each creation's (slot, server uuid once acknowledged)."""
        counts: Placed = {}
        for slot, server in slots:
            target = slot.target
            group = self.known.get(target) if isinstance(target, str) else None
            if isinstance(target, PendingGroup) or (group and server not in group.servers):
                assert target is not None
                counts[target] = counts.get(target, 0) + 1
        return counts

    def assign(self, count: int, placed: Placed, new_name: str) -> list[Slot]:
        """Slots for `count` new creations; creates PendingGroups as needed (named by
        `new_name` plus a suffix)."""
        rooms: dict[str | PendingGroup, int] = {
            uuid: MAX_MEMBERS - len(group.servers) - placed.get(uuid, 0)
            for uuid, group in self.known.items()
            # One of another zone (the group's zone changed) would be refused by the API.
            if uuid not in self.full and uuid not in self.deleting and group.zone == self.zone
        }
        rooms.update({p: MAX_MEMBERS - placed.get(p, 0) for p in self.pending})
        slots: list[Slot] = []
        for target in sorted(rooms, key=lambda t: rooms[t]):  # fullest first
            while rooms[target] > 0 and len(slots) < count:
                rooms[target] -= 1
                slots.append(_slot(target))
        while len(slots) < count:
            pending = PendingGroup(f"{new_name}-{names.random_suffix()}")
            self.pending.append(pending)
            slots += [Slot(pending=pending) for _ in range(min(MAX_MEMBERS, count - len(slots)))]
        return slots

    def empty(self, placed: Placed, now: float, grace: float) -> list[str]:
        """Known server groups with no member and nothing placed for `grace` seconds now: to
        delete."""
        empty = {
            uuid
            for uuid, group in self.known.items()
            if not group.servers and not placed.get(uuid) and uuid not in self.deleting
        }
        self.empty_since = {u: self.empty_since.get(u, now) for u in empty}
        return [uuid for uuid, since in self.empty_since.items() if now - since >= grace]


def managed_tags(cluster: str, group: str) -> dict[str, str]:
    """The tags of a server group the provider manages for node group `group`."""
    return {TAG_CLUSTER: cluster, TAG_GROUP: group, TAG_MANAGED: MANAGED}


def managed_by(cluster: str, group: str, server_group: ServerGroup) -> bool:
    tags = server_group.tags
    return all(tags.get(key) == value for key, value in managed_tags(cluster, group).items())


class ServerGroups:
    """Creates and deletes the managed server groups (the API calls, in the background)."""

    def __init__(
        self,
        cloud: Cloud,
        background: Background,
        cluster: str,
        fence: Fence,
        tick: Callable[[], int],
    ) -> None:
        self._cloud = cloud
        self._background = background
        self._cluster = cluster
        self._fence = fence
        self._tick = tick
        # Managed server groups of node groups that manage none (no such group configured,
        # or antiAffinity off), by node group: tidied when empty, reported until then.
        self.orphans: dict[str, Placement] = {}

    def tags(self, group: str) -> dict[str, str]:
        return managed_tags(self._cluster, group)

    def place(self, group: str, placement: Placement, count: int, placed: Placed) -> list[Slot]:
        """Slots for `count` creations of `group`; new server groups are created at once."""
        before = len(placement.pending)
        slots = placement.assign(count, placed, f"{self._cluster}-{group}")
        for pending in placement.pending[before:]:
            self._background.spawn(self._create(group, placement, pending))
        return slots

    async def _create(self, group: str, placement: Placement, pending: PendingGroup) -> None:
        try:
            made = await self._cloud.create_server_group(
                pending.name, placement.zone or "", self.tags(group), self._fence
            )
        except Exception as error:  # a bug too: the creations placed here must not wait forever
            if isinstance(error, CloudError):
                failure = error
                log.warning(
                    "group %s: creating server group %s failed: %s", group, pending.name, error
                )
            else:
                failure = _internal(error)
                log.exception("group %s: creating server group %s crashed", group, pending.name)
            _fail(pending, failure)
            return
        except asyncio.CancelledError:  # shutdown: nobody may wait on it for ever
            _fail(pending, _internal(asyncio.CancelledError()))
            raise
        finally:
            placement.pending.remove(pending)
        placement.made(made, self._tick())
        log.info(
            "group %s: created anti-affinity server group %s (%s)", group, made.name, made.uuid
        )
        pending.created.set_result(made.uuid)

    def refused(self, placement: Placement, slot: Slot, error: CloudError) -> None:
        """A create into `slot` was refused: keep the server group from being used until the
        next listing says how it is."""
        if slot.uuid is None:
            return
        if isinstance(error, ServerGroupFullError):
            placement.full.add(slot.uuid)
        elif isinstance(error, ServerGroupGoneError):
            placement.known.pop(slot.uuid, None)

    def tidy(
        self, group: str, placement: Placement, placed: Placed, now: float, grace: float
    ) -> None:
        """Delete the node group's managed server groups empty for `grace` (in the
        background)."""
        for uuid in placement.empty(placed, now, grace):
            placement.deleting.add(uuid)
            self._background.spawn(self._delete(group, placement, uuid))

    def apply_orphans(self, listed: dict[str, list[ServerGroup]], start_tick: int) -> None:
        """The listing's managed server groups of node groups that manage none, by node
        group (a node group none of whose server groups is listed any more is forgotten)."""
        self.orphans = {
            name: placement
            for name, placement in self.orphans.items()
            if name in listed or placement.deleting
        }
        for name, groups in listed.items():
            self.orphans.setdefault(name, Placement(None)).apply_listing(groups, start_tick)

    def orphaned_server_groups(self, name: str) -> int:
        placement = self.orphans.get(name)
        return 0 if placement is None else len(placement.known)

    async def _delete(self, group: str, placement: Placement, uuid: str) -> None:
        name = placement.known[uuid].name if uuid in placement.known else uuid
        try:
            await self._cloud.delete_server_group(uuid)
        except CloudError as error:
            placement.deleting.discard(uuid)  # the next listing tries again
            log.warning("group %s: deleting empty server group %s failed: %s", group, name, error)
            return
        placement.gone(uuid, self._tick())
        placement.deleting.discard(uuid)
        log.info("group %s: deleted empty anti-affinity server group %s (%s)", group, name, uuid)


def _fail(pending: PendingGroup, failure: CloudError) -> None:
    pending.created.set_exception(failure)
    pending.created.exception()  # retrieved: each creation placed there reports it


def _internal(error: BaseException) -> CloudError:
    return CloudError(f"internal error: {error!r}", None, "create_server_group")
