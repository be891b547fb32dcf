"""One node group's state and the synchronous rules over it.

Target size is never stored: it is computed from what the cloud listed, what we are creating
and what failed, so every path (Refresh, restart, races, manual changes) converges on the
same number:

    target = listed servers whose deletion was not requested + creations not yet listed
             + placeholders

A server's deletion is requested by tagging it (TAG_DELETION) before deleting it, so a
restarted provider reads from the listing alone which servers are being deleted.

Everything here runs on the event loop without awaiting, so each method is atomic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cloudscale_autoscaler.cloud.models import TAG_DELETION, TAG_REQUEST, Server
from cloudscale_autoscaler.engine import instances
from cloudscale_autoscaler.engine.errors import FailedPrecondition
from cloudscale_autoscaler.engine.placement import Placed, Placement, Slot
from cloudscale_autoscaler.engine.providerid import (
    parse_placeholder_id,
    parse_server_uuid,
)
from cloudscale_autoscaler.engine.records import (
    Batch,
    Creation,
    CreationState,
    Placeholder,
    Recent,
)
from cloudscale_autoscaler.journal.entries import Entry
from cloudscale_autoscaler.observability.echo import clip
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.settings.types import NodeGroupConfig

log = logging.getLogger(__name__)


def _for_node(config: NodeGroupConfig) -> pb.NodeGroupForNodeResponse:
    group = pb.NodeGroup(id=config.name, minSize=config.min_size, maxSize=config.max_size)
    return pb.NodeGroupForNodeResponse(nodeGroup=group)


@dataclass(frozen=True)
class NodeRef:
    """A node CA asks us to delete: providerID and name as CA sent them."""

    provider_id: str
    name: str = ""

    @property
    def shown(self) -> str:
        return clip(self.name or self.provider_id) or "<node without name and providerID>"


@dataclass(frozen=True)
class DeleteServer:
    node: NodeRef
    uuid: str
    # The server is broken (status error): it never counts against minSize.
    broken: bool = False


@dataclass(frozen=True)
class RemovePlaceholder:
    node: NodeRef
    ident: str


@dataclass(frozen=True)
class AlreadyGone:
    """Ours once and gone (or being deleted right now): deleting it again is a success."""

    node: NodeRef
    uuid: str | None = None


Resolved = DeleteServer | RemovePlaceholder | AlreadyGone


class GroupState:
    def __init__(self, config: NodeGroupConfig) -> None:
        self.config = config
        self.name = config.name
        # Prebuilt: NodeGroupForNode answers with this very object for every node of the group.
        self.for_node = _for_node(config)
        self.servers: dict[str, Server] = {}  # uuid -> server, from the latest listing
        self.server_names: set[str] = set()
        self.creations: dict[str, Creation] = {}  # request id -> creation in flight
        self.placeholders: dict[str, Placeholder] = {}  # id (= request id) -> failed creation
        self.deleting: dict[str, asyncio.Task[None]] = {}  # uuid -> our delete in flight
        self.deleted: dict[str, int] = {}  # uuid -> tick our delete succeeded
        self.gone = Recent()
        # Request ids of the creations this process started (and not yet seen to end): a
        # listed server without one was created by someone else (item: overshoot_warned).
        self.issued: set[str] = set()
        # Whether the "above maxSize, created elsewhere" warning was given for this episode.
        self.overshoot_warned = False
        # The anti-affinity server groups the provider manages for it; None without antiAffinity.
        self.placement = Placement(config.zone) if config.anti_affinity else None
        # uuid -> ((status, name, deleting, booting), Instance): NodeGroupNodes reuses
        # unchanged ones (building 20,000 messages per call costs tens of milliseconds).
        self._instances: dict[str, tuple[tuple[str, str, bool, bool], pb.Instance]] = {}

    def reconfigure(self, config: NodeGroupConfig) -> None:
        """Take a reloaded config of this group (same name): sizes, template and create
        settings apply from the next call; what it holds (servers, creations, placeholders,
        deletions) stays."""
        self.config = config
        self.for_node = _for_node(config)
        if not config.anti_affinity:
            self.placement = None  # its server groups stay in the cloud, as servers do
        elif self.placement is None or self.placement.zone != config.zone:
            self.placement = Placement(config.zone)  # found again by the next listing

    # --- counting -------------------------------------------------------------------------

    def pending_creations(self) -> Iterator[Creation]:
        """Creations that count on top of the listing: not sent, sent, or acked but unlisted."""
        return (c for c in self.creations.values() if c.uuid is None or c.uuid not in self.servers)

    def deletion_requested(self, uuid: str) -> bool:
        """Deleted by us, or tagged for deletion (by us, possibly before a restart)."""
        server = self.servers.get(uuid)
        return uuid in self.deleted or (server is not None and self._requested(uuid, server))

    def _requested(self, uuid: str, server: Server) -> bool:
        """deletion_requested for a listed server already in hand (loops over every server)."""
        return uuid in self.deleted or TAG_DELETION in server.tags

    def marked_for_deletion(self) -> list[str]:
        """Listed servers tagged for deletion whose deletion nobody is carrying out."""
        busy = self.deleting.keys() | self.deleted.keys()
        return [
            uuid
            for uuid, server in self.servers.items()
            if TAG_DELETION in server.tags and uuid not in busy
        ]

    def target(self) -> int:
        requested = sum(1 for uuid, server in self.servers.items() if self._requested(uuid, server))
        return (
            len(self.servers)
            - requested
            + sum(1 for _ in self.pending_creations())
            + len(self.placeholders)
        )

    def deletions_in_flight(self) -> int:
        """Servers still counted in the target whose deletion is under way."""
        return sum(
            1
            for uuid in self.deleting
            if uuid in self.servers and not self.deletion_requested(uuid)
        )

    # --- the cloud's view -------------------------------------------------------------------

    def foreign_servers(self) -> int:
        """Listed servers (their deletion not requested) this process did not create."""
        return sum(
            1
            for uuid, server in self.servers.items()
            if server.tags.get(TAG_REQUEST) not in self.issued and not self._requested(uuid, server)
        )

    def above_max(self) -> int:
        """Listed servers (their deletion not requested) beyond maxSize: this provider never
        creates them, so another writer did (or maxSize was lowered)."""
        live = sum(1 for uuid, server in self.servers.items() if not self._requested(uuid, server))
        return max(0, live - self.config.max_size)

    def apply_listing(self, servers: dict[str, Server], start_tick: int) -> None:
        """Replace the group's servers with a listing that started at `start_tick`."""
        for uuid in self.servers.keys() - servers.keys():
            self.gone.add(uuid)
        self.servers = servers
        self.server_names = {server.name for server in servers.values()}
        self._match_request_tags()
        for request_id, creation in list(self.creations.items()):
            if creation.uuid is None:
                continue
            if creation.uuid in servers:
                del self.creations[request_id]  # listed: counted as a server from now on
            elif creation.acked_tick < start_tick:
                # Acknowledged before this listing began and absent from it: deleted behind
                # our back. Dropping it lowers the target, as any manual delete does.
                log.info(
                    "group %s: new server %s vanished before it was listed",
                    self.name,
                    creation.uuid,
                )
                del self.creations[request_id]
                self.gone.add(creation.uuid)
        # Keep the request ids still to be seen: creations and placeholders, listed servers.
        listed = {server.tags.get(TAG_REQUEST) for server in servers.values()}
        self.issued = {
            rid
            for rid in self.issued
            if rid in listed or rid in self.creations or rid in self.placeholders
        }
        # Forget our deletions once a listing begun after them no longer shows the server.
        self.deleted = {
            uuid: tick
            for uuid, tick in self.deleted.items()
            if uuid in servers or tick > start_tick
        }

    def _match_request_tags(self) -> None:
        """A listed server carrying the request tag of a creation we still await (or of one we
        recorded as failed) IS that creation: count it once, as a server."""
        waiting = {rid for rid, c in self.creations.items() if c.uuid is None}
        waiting.update(self.placeholders)
        if not waiting:
            return
        for server in self.servers.values():
            request_id = server.tags.get(TAG_REQUEST)
            if request_id is None or request_id not in waiting:
                continue
            if self.creations.pop(request_id, None) is not None:
                log.debug("group %s: creation %s listed as %s", self.name, request_id, server.uuid)
            if self.placeholders.pop(request_id, None) is not None:
                log.warning(
                    "group %s: create request %s was reported failed but server %s exists; "
                    "counting the server instead of the placeholder",
                    self.name,
                    request_id,
                    server.uuid,
                )
                self.gone.add(request_id)

    # --- anti-affinity server groups ----------------------------------------------------------

    def placed(self) -> Placed:
        """Creations placed per managed server group and not yet listed as its members."""
        if self.placement is None:
            return {}
        slots = ((c.slot, c.uuid) for c in self.creations.values() if c.slot is not None)
        return self.placement.placed(slots)

    def has_unconfirmed(self) -> bool:
        """Whether creates of unknown outcome (an earlier process's, or unanswered) are still
        counted, unlisted."""
        return any(c.expires is not None for c in self.creations.values())

    def journal_entries(self) -> Iterator[Entry]:
        """What the creation journal must hold for this group: every create the API has not
        answered (queued, sent, or of unknown outcome), with its server group if known."""
        for creation in self.creations.values():
            if creation.uuid is None:
                target = creation.slot.target if creation.slot is not None else None
                server_group = target if isinstance(target, str) else None
                yield Entry(
                    creation.request_id,
                    self.name,
                    creation.name,
                    creation.recorded_at,
                    server_group,
                )

    # --- creates of unknown outcome ------------------------------------------------------------

    def listed_requests(self) -> set[str]:
        return {rid for server in self.servers.values() if (rid := server.tags.get(TAG_REQUEST))}

    def adopt(self, entry: Entry, expires: float) -> None:
        """Count a create that an earlier process recorded and sent (or was about to send)
        until a listing shows its request tag or `expires` passes, in the server group it
        named; the caller checked that it is neither listed nor known here."""
        creation = Creation(entry.request, entry.name, Batch(1), CreationState.SENDING)
        creation.recorded_at, creation.expires = entry.at, expires
        if entry.server_group is not None and self.placement is not None:
            creation.slot = Slot(uuid=entry.server_group)
        self.creations[entry.request] = creation
        self.issued.add(entry.request)  # ours, though another process sent it

    def expire_unconfirmed(self, now: float) -> list[Creation]:
        """Creates of unknown outcome no listing showed within their bound, dropped from the
        count."""
        expired = [
            c
            for c in self.creations.values()
            if c.expires is not None and c.uuid is None and now >= c.expires
        ]
        for creation in expired:
            del self.creations[creation.request_id]
        return expired

    # --- placeholders -------------------------------------------------------------------------

    def add_placeholder(self, placeholder: Placeholder) -> None:
        self.placeholders[placeholder.ident] = placeholder

    def remove_placeholder(self, ident: str) -> bool:
        if self.placeholders.pop(ident, None) is None:
            return False
        self.gone.add(ident)
        return True

    def expire_placeholders(self, now: float, lifetime: float) -> int:
        expired = [p.ident for p in self.placeholders.values() if now - p.created >= lifetime]
        for ident in expired:
            log.info("group %s: failed-creation placeholder %s expired", self.name, ident)
            self.remove_placeholder(ident)
        return len(expired)

    # --- decrease -----------------------------------------------------------------------------

    def cancellable(self) -> tuple[list[str], list[Creation]]:
        """Placeholders (oldest first) and unsent creations (newest first) a decrease may drop."""
        queued = [c for c in self.creations.values() if c.state is CreationState.QUEUED]
        return list(self.placeholders), queued[::-1]

    # --- CA's view ----------------------------------------------------------------------------

    def instances(self, now_unix: float) -> list[pb.Instance]:
        cache = self._instances
        fresh: dict[str, tuple[tuple[str, str, bool, bool], pb.Instance]] = {}
        out = []
        for uuid, server in self.servers.items():
            deleting = uuid in self.deleting or self._requested(uuid, server)
            booting = server.status == "changing" and instances.booting(server, now_unix)
            key = (server.status, server.name, deleting, booting)
            entry = cache.get(uuid)
            if entry is None or entry[0] != key:
                entry = (key, instances.server_instance(server, deleting, booting))
            fresh[uuid] = entry
            out.append(entry[1])
        self._instances = fresh
        # Creations the API has not acknowledged have no id yet; CA counts them as upcoming
        # (target minus instances), so they are left out rather than invented.
        out.extend(
            instances.acked_instance(c.uuid) for c in self.pending_creations() if c.uuid is not None
        )
        out.extend(instances.placeholder_instance(p) for p in self.placeholders.values())
        return out

    # --- deletion -----------------------------------------------------------------------------

    def resolve(self, node: NodeRef, owner_of: Callable[[str], str | None]) -> Resolved:
        """Which of our things `node` is, or FailedPrecondition naming it if it is not ours.

        `owner_of(uuid)` names the configured group that lists the server, if any.
        """
        ident = parse_placeholder_id(node.provider_id)
        if ident is not None:
            if ident in self.placeholders:
                return RemovePlaceholder(node, ident)
            if ident in self.gone:
                return AlreadyGone(node)
            raise FailedPrecondition(
                f"node {node.shown}: no failed-creation placeholder {clip(ident)!r} in node group "
                f"{self.name}"
            )
        uuid = self._uuid_for(node)
        server = self.servers.get(uuid)
        if uuid in self.deleting or self.deletion_requested(uuid):
            return AlreadyGone(node, uuid)
        if server is not None:
            return DeleteServer(node, uuid, broken=server.status == "error")
        acked = any(c.uuid == uuid for c in self.creations.values())
        if acked:
            return DeleteServer(node, uuid)
        owner = owner_of(uuid)
        # Checked before `gone`: a server re-tagged to another group left ours but is not gone.
        if owner is None and uuid in self.gone:
            return AlreadyGone(node, uuid)
        where = (
            f"it belongs to node group {owner}"
            if owner
            else ("no server with that uuid is tagged for this cluster and group")
        )
        raise FailedPrecondition(
            f"node {node.shown} (server {uuid}) is not in node group {self.name}: {where}"
        )

    def _uuid_for(self, node: NodeRef) -> str:
        if node.provider_id:
            uuid = parse_server_uuid(node.provider_id)
            if uuid is None:
                raise FailedPrecondition(
                    f"node {node.shown}: providerID {clip(node.provider_id)!r} is not a cloudscale "
                    "server (expected cloudscale://<uuid>)"
                )
            return uuid
        # No providerID (a node the CCM has not initialised): only an exact, unambiguous server
        # name of this very group identifies it.
        matches = [s.uuid for s in self.servers.values() if node.name and s.name == node.name]
        if len(matches) != 1:
            reason = "several servers" if matches else "no server"
            raise FailedPrecondition(
                f"node {node.shown} has no providerID and {reason} of node group {self.name} "
                "has that name"
            )
        return matches[0]
