"""Deletions: NodeGroupDeleteNodes, the tagged delete, and resuming deletions nobody
carries out.

Owns each group's deletions in flight (`deleting`: uuid -> task, shared by every caller
that asks for the same server), the record of deletions that succeeded (`deleted`,
`gone`), the deletion tag written to listed servers, and dropping the creation records of
servers it deleted. Runs on the asyncio loop only: DeleteNodes' minSize check, its
placeholder removals and the start of its deletions happen without an await in between.

Design decisions:
- DeleteNodes re-lists the cluster before deleting, so only servers that the cloud lists,
  right now, with this cluster's and this group's tags are ever deleted. Each server is
  tagged TAG_DELETION before its DELETE; Refresh finishes deletions of tagged servers that
  nobody carries out (after a restart, or a failed DELETE).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import TAG_DELETION
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.engine.background import Background
from cloudscale_autoscaler.engine.errors import (
    CloudUnavailable,
    FailedPrecondition,
    InvalidArgument,
)
from cloudscale_autoscaler.engine.group import (
    DeleteServer,
    GroupState,
    NodeRef,
    RemovePlaceholder,
    Resolved,
)
from cloudscale_autoscaler.engine.inventory import Inventory
from cloudscale_autoscaler.engine.observer import Observer
from cloudscale_autoscaler.observability.echo import clip

log = logging.getLogger(__name__)


class Deletions:
    def __init__(
        self, cloud: Cloud, inventory: Inventory, background: Background, observer: Observer
    ) -> None:
        self._cloud = cloud
        self._inventory = inventory
        self._background = background
        self._observer = observer

    # --- NodeGroupDeleteNodes -------------------------------------------------------------

    async def delete_nodes(self, name: str, nodes: Sequence[NodeRef]) -> None:
        group = self._inventory.group(name)
        if not nodes:
            raise InvalidArgument("no nodes given: expected at least one node to delete")
        # Re-list before deleting: a server is deleted only if the cloud lists it NOW with this
        # cluster's and this group's tags (tags may have changed since the last Refresh).
        await self._inventory.sync(f"DeleteNodes {name}")
        # No await from here until the deletions are started: checks and marks are atomic.
        self._inventory.expire(group)
        resolved = _unique([group.resolve(node, self._inventory.owner_of) for node in nodes])
        self._check_min_size(group, resolved)
        waits: list[tuple[NodeRef, asyncio.Task[None]]] = []
        for item in resolved:
            if isinstance(item, RemovePlaceholder):
                group.remove_placeholder(item.ident)
            elif isinstance(item, DeleteServer):
                waits.append((item.node, self._start(group, item.uuid, item.node.name)))
            elif item.uuid is not None and item.uuid in group.deleting:
                waits.append((item.node, group.deleting[item.uuid]))  # share it
        if not waits:
            return
        # Shielded: a cancelled RPC (CA's deadline) must not abort deletions already sent;
        # they finish and are accounted for.
        results = await asyncio.shield(
            asyncio.gather(*(task for _, task in waits), return_exceptions=True)
        )
        failed = [
            f"{node.shown} ({clip(node.provider_id) or 'no providerID'}): {result}"
            for (node, _), result in zip(waits, results, strict=True)
            if isinstance(result, BaseException)
        ]
        if failed:
            raise CloudUnavailable(
                f"deleting {len(failed)} of {len(resolved)} node(s) of node group {name} "
                f"failed (the others are deleted): {'; '.join(failed)}"
            )

    def _check_min_size(self, group: GroupState, resolved: list[Resolved]) -> None:
        counted = sum(1 for r in resolved if isinstance(r, DeleteServer) and not r.broken)
        if not counted:
            return  # only placeholders, broken servers and no-ops: exempt from minSize
        placeholders = sum(1 for r in resolved if isinstance(r, RemovePlaceholder))
        target = group.target()
        in_flight = group.deletions_in_flight()
        remaining = target - in_flight - placeholders - counted
        if remaining < group.config.min_size:
            raise FailedPrecondition(
                f"deleting {counted} node(s) from node group {group.name} would take it below "
                f"its minSize {group.config.min_size} (target size {target}, "
                f"{in_flight} deletion(s) already in flight)"
            )

    # --- resumed on Refresh ---------------------------------------------------------------

    def resume(self) -> None:
        """Finish deletions requested before a restart (or whose DELETE failed): servers
        listed with the deletion tag that nobody is deleting."""
        for group in self._inventory.groups.values():
            for uuid in group.marked_for_deletion():
                log.info(
                    "group %s: finishing the deletion of server %s (tagged %s)",
                    group.name,
                    uuid,
                    TAG_DELETION,
                )
                self._start(group, uuid)

    # --- one deletion ---------------------------------------------------------------------

    def _start(self, group: GroupState, uuid: str, node: str = "") -> asyncio.Task[None]:
        """`node`: the Node name CA sent, if any (for the observer)."""
        task = group.deleting.get(uuid)
        if task is None:
            task = group.deleting[uuid] = self._background.spawn(self._delete(group, uuid, node))
            # Resumed deletions have no waiter: their failure is logged, not left unretrieved.
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task

    async def _delete(self, group: GroupState, uuid: str, node: str) -> None:
        try:
            await self._tagged_delete(group, uuid)
        except BaseException as error:
            group.deleting.pop(uuid, None)
            if isinstance(error, CloudError):
                log.warning("group %s: deleting server %s failed: %s", group.name, uuid, error)
                self._observer.deletion_failed(group.name, uuid, node, error)
            raise
        group.deleting.pop(uuid, None)
        group.deleted[uuid] = self._inventory.tick()
        group.gone.add(uuid)
        for request_id, creation in list(group.creations.items()):
            if creation.uuid == uuid:
                del group.creations[request_id]
        log.info("group %s: deleted server %s", group.name, uuid)

    async def _tagged_delete(self, group: GroupState, uuid: str) -> None:
        """Tag the server (TAG_DELETION), then DELETE it. The tag makes the request survive a
        crash: a restarted provider reads it from the listing, reports the server as deleting
        and finishes the deletion. When the deletion certainly did not happen (the tag failed,
        or the API refused the DELETE), the tags are put back, so CA's retry starts afresh; if
        that fails too, the tag stays and the next Refresh finishes the deletion."""
        server = group.servers.get(uuid)
        original = None if server is None or TAG_DELETION in server.tags else server.tags
        if original is not None:
            try:
                await self._set_tags(group, uuid, {**original, TAG_DELETION: _utc_now()})
            except CloudError as error:
                if not _refused(error):
                    await self._untag(group, uuid, original)  # the answer may be lost, not the tag
                raise
        try:
            await self._cloud.delete_server(uuid)  # 404 = already gone = success
        except CloudError as error:
            if original is not None and _refused(error):
                await self._untag(group, uuid, original)  # nothing was deleted
            raise

    async def _set_tags(self, group: GroupState, uuid: str, tags: dict[str, str]) -> None:
        await self._cloud.set_tags(uuid, tags)
        listed = group.servers.get(uuid)
        if listed is not None:
            group.servers[uuid] = dataclasses.replace(listed, tags=tags)
            # The tag changes the target: republish before the DELETE ends.
            self._background.on_change()

    async def _untag(self, group: GroupState, uuid: str, original: dict[str, str]) -> None:
        try:
            await self._set_tags(group, uuid, original)
        except CloudError as error:
            log.warning(
                "group %s: server %s may keep its %s tag (%s): the next Refresh deletes it",
                group.name,
                uuid,
                TAG_DELETION,
                error,
            )


def _refused(error: CloudError) -> bool:
    """The API answered 4xx: it certainly did not carry the request out (429s were retried)."""
    return error.status is not None and 400 <= error.status < 500


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _unique(resolved: list[Resolved]) -> list[Resolved]:
    """The same node twice in one request is deleted (and counted) once."""
    seen: set[tuple[str, str]] = set()
    out = []
    for item in resolved:
        if isinstance(item, RemovePlaceholder):
            key = ("placeholder", item.ident)
        elif isinstance(item, DeleteServer):
            key = ("server", item.uuid)
        else:
            key = ("gone", item.uuid or item.node.provider_id)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out
