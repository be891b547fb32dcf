"""Creations: NodeGroupIncreaseSize's batches, their placeholders and verdicts, and
NodeGroupDecreaseTargetSize, which takes back only what was never created.

Owns the create slots (maxConcurrentCreates), each group's creations in flight and the
request ids it issued, and the placeholders of failed creations (a listing that shows one
after all turns it into a server; expiry and DeleteNodes remove them). Runs on the asyncio
loop only: from the maxSize check to the spawned creations there is no await, and each
creation's outcome is recorded in one synchronous stretch.

Design decisions:
- IncreaseSize bumps the target at once, starts creations in the background (bounded by
  maxConcurrentCreates) and waits at most `increaseSizeWait` for the verdict: the first
  success, or every attempt failing. If all failed with a permanent refusal (bad token,
  unknown image), the bump is rolled back and the error returned; quota and capacity refusals
  always become placeholders of class OutOfResources (see refusals.py). The first quota,
  capacity or permanent refusal stops the batch: creates not yet sent become placeholders
  with the same error instead of being sent.
- DecreaseTargetSize removes placeholders first, then creations not yet sent; it never
  deletes a server (CA deletes nodes through DeleteNodes).
- With a creation journal, a batch's creates are recorded before the first is sent; if the
  record cannot be written, none is sent and each fails like a create the API refused
  (transient: IncreaseSize answers UNAVAILABLE within its wait, a placeholder after it). A
  create into a managed server group still being made is recorded again, naming it, before
  it is sent.
- A create is sent only while the engine's fence allows it (leader election: this replica
  holds the Lease), asked before each attempt; one refused so is a failed creation.
- A create whose outcome stays unknown (sent, never answered, not found by its request tag)
  is neither a success nor a failure: it stays counted, and in the journal, as a create an
  earlier process recorded is, until a listing shows it or the bound passes.
- Everything an IncreaseSize reads before its last await (the group, its config, the
  networks) is read again after it: a reload meanwhile may have changed or removed the group.
  A group a reload removed sends nothing more: its queued creates are cancelled (`retire`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from cloudscale_autoscaler.cloud.errors import CloudError, OutcomeUnknownError
from cloudscale_autoscaler.cloud.models import TAG_REQUEST, InterfaceRequest, Server, ServerSpec
from cloudscale_autoscaler.cloud.protocol import Cloud, Fence
from cloudscale_autoscaler.engine import names, refusals, spec
from cloudscale_autoscaler.engine.background import Background
from cloudscale_autoscaler.engine.catalog import Catalog
from cloudscale_autoscaler.engine.errors import (
    CloudUnavailable,
    FailedPrecondition,
    InvalidArgument,
)
from cloudscale_autoscaler.engine.group import GroupState
from cloudscale_autoscaler.engine.inventory import API_UNREACHABLE, Inventory
from cloudscale_autoscaler.engine.networks import NetworkResolver
from cloudscale_autoscaler.engine.observer import Observer
from cloudscale_autoscaler.engine.placement import Slot
from cloudscale_autoscaler.engine.providerid import format_provider_id, placeholder_provider_id
from cloudscale_autoscaler.engine.records import Batch, Creation, CreationState, Placeholder
from cloudscale_autoscaler.journal.store import JournalError
from cloudscale_autoscaler.settings.types import Config
from cloudscale_autoscaler.template.userdata import UserDataError

log = logging.getLogger(__name__)

# How often an IncreaseSize prepares again when a reload changes its group meanwhile.
PREPARE_ATTEMPTS = 3


class Creations:
    def __init__(
        self,
        config: Config,
        cloud: Cloud,
        inventory: Inventory,
        background: Background,
        catalog: Catalog,
        observer: Observer,
        clock: Callable[[], float],
        fence: Fence,
    ) -> None:
        self._config = config
        self._fence = fence
        self._cloud = cloud
        self._inventory = inventory
        self._background = background
        self._catalog = catalog
        self._observer = observer
        self._networks = NetworkResolver(cloud)
        self._clock = clock
        self._create_slots = asyncio.Semaphore(config.cloudscale.max_concurrent_creates)

    def reconfigure(self, config: Config) -> None:
        """maxConcurrentCreates is not reloadable: the slots stay."""
        self._config = config

    # --- NodeGroupIncreaseSize ------------------------------------------------------------

    async def increase_size(self, name: str, delta: int) -> None:
        self._inventory.group(name)
        if delta <= 0:
            raise InvalidArgument(f"delta must be positive, got {delta}")
        if self._background.closing:
            raise CloudUnavailable("shutting down: not starting new creations")
        await self._inventory.ensure_loaded(f"IncreaseSize {name}")
        if self._inventory.api_down is not None:
            # Creations would only fail into placeholders once the client's retries run out:
            # refuse now, target untouched (CA backs the group off and retries later).
            raise CloudUnavailable(
                f"IncreaseSize {name}: {API_UNREACHABLE} (the last listing failed: "
                f"{self._inventory.api_down}); not creating servers, target size unchanged"
            )
        group, interfaces = await self._prepared(name)
        # From here to the spawns there is no await: the max check and the bump are atomic.
        held = self._inventory.held()
        if held is not None:
            raise CloudUnavailable(f"IncreaseSize {name}: {held}; target size unchanged")
        problem = self._catalog.creation_problem(group.config)
        if problem is not None:
            raise FailedPrecondition(problem)
        self._inventory.expire(group)
        target = group.target()
        if target + delta > group.config.max_size:
            raise FailedPrecondition(
                f"increasing node group {name} by {delta} would exceed its maxSize "
                f"{group.config.max_size} (target size is {target})"
            )
        specs = self._new_specs(group, delta, interfaces)
        batch = Batch(delta)
        slots = self._place(group, delta)
        for server_spec, slot in zip(specs, slots, strict=True):
            self._start_creation(group, batch, server_spec, slot)
        journal = self._inventory.journal
        if journal is not None:  # the batch's creates are registered: the write covers them
            batch.recorded = asyncio.ensure_future(journal.persist())
        log.info(
            "group %s: creating %d server(s), target %d -> %d", name, delta, target, target + delta
        )
        await self._verdict(group, batch)

    async def _prepared(self, name: str) -> tuple[GroupState, tuple[InterfaceRequest, ...] | None]:
        """The group as configured now, with its create request's interfaces and the flavor
        list at hand; read again while a reload changes the group during the awaits."""
        for _ in range(PREPARE_ATTEMPTS):
            group = self._inventory.group(name)  # NOT_FOUND once a reload removed it
            config = group.config
            interfaces = await self._networks.interfaces(config)
            await self._catalog.ensure()  # the flavor decides labels and refusals
            if self._inventory.groups.get(name) is group and group.config is config:
                return group, interfaces
        raise CloudUnavailable(
            f"IncreaseSize {name}: the node group's config kept changing (reloads) while its "
            "creates were prepared; target size unchanged"
        )

    def _new_specs(
        self,
        group: GroupState,
        count: int,
        interfaces: tuple[InterfaceRequest, ...] | None = None,
    ) -> list[ServerSpec]:
        """`count` create requests with names unique in the group (listed or in flight)."""
        cluster = self._config.cluster
        in_flight = {c.name for c in group.creations.values()}
        chosen: list[str] = []
        while len(chosen) < count:
            name = names.server_name(cluster, group.name, names.random_suffix())
            if name not in group.server_names and name not in in_flight:
                in_flight.add(name)
                chosen.append(name)
        node_labels = self._catalog.node_labels(group.config)
        try:
            return [
                spec.build_spec(
                    cluster, group.config, name, names.request_id(), node_labels, interfaces
                )
                for name in chosen
            ]
        except UserDataError as error:
            raise FailedPrecondition(f"node group {group.name}: {error}") from error

    def _place(self, group: GroupState, count: int) -> list[Slot | None]:
        """Where each new creation goes: managed server groups (antiAffinity), else nowhere."""
        if group.placement is None:
            return [None] * count
        places = self._inventory.server_groups
        return list(places.place(group.name, group.placement, count, group.placed()))

    def _start_creation(
        self, group: GroupState, batch: Batch, server_spec: ServerSpec, slot: Slot | None
    ) -> None:
        request_id = server_spec.tags[TAG_REQUEST]
        creation = Creation(request_id, server_spec.name, batch, slot=slot)
        group.issued.add(request_id)
        group.creations[request_id] = creation
        self._background.spawn(self._create(group, creation, server_spec))

    async def _verdict(self, group: GroupState, batch: Batch) -> None:
        try:
            async with asyncio.timeout(self._config.increase_size_wait_seconds):
                await batch.settled.wait()
        except TimeoutError:
            return  # still in flight: slow creations report through NodeGroupNodes
        error = batch.first_error
        if not batch.all_failed or error is None or not refusals.fails_the_rpc(error):
            # Quota and capacity refusals stay placeholders, fast or slow: CA then records
            # OutOfResources with our code, backs the group off and deletes them.
            return
        for ident in batch.placeholder_ids:
            group.remove_placeholder(ident)
        raise refusals.rpc_error(
            error,
            f"creating {batch.size} server(s) in node group {group.name} failed, "
            f"target size rolled back: {error}",
        )

    # --- one creation ---------------------------------------------------------------------

    async def _create(self, group: GroupState, creation: Creation, server_spec: ServerSpec) -> None:
        if not await self._recorded(group, creation):
            return
        joins_new_group = creation.slot is not None and creation.slot.uuid is None
        try:
            server_spec = await self._into_server_group(creation, server_spec)
        except CloudError as error:  # its server group could not be created
            if group.creations.get(creation.request_id) is creation:
                self._creation_failed(group, creation, error)
            return
        # The journal must name the server group before the create goes out (a successor
        # counts it there); a no-op when the batch's write named it already.
        if joins_new_group and not await self._recorded(group, creation, again=True):
            return
        async with self._create_slots:
            if group.creations.get(creation.request_id) is not creation:
                return  # cancelled, or already listed, while it waited for a slot
            creation.state = CreationState.SENDING
            try:
                server = await self._cloud.create_server(server_spec, self._fence)
            except OutcomeUnknownError as error:
                self._creation_in_doubt(group, creation, error)
                return
            except CloudError as error:
                if creation.slot is not None and group.placement is not None:
                    self._inventory.server_groups.refused(group.placement, creation.slot, error)
                self._creation_failed(group, creation, error)
                return
            except Exception as error:  # a bug must still leave an accounted placeholder
                log.exception("group %s: creating %s crashed", group.name, creation.name)
                failure = CloudError(f"internal error: {error!r}", None, "create_server")
                self._creation_failed(group, creation, failure)
                return
        self._creation_acked(group, creation, server)

    @staticmethod
    async def _into_server_group(creation: Creation, server_spec: ServerSpec) -> ServerSpec:
        """The create request with its managed server group, once that group exists."""
        if creation.slot is None:
            return server_spec
        return replace(server_spec, server_groups=(await creation.slot.resolve(),))

    async def _recorded(
        self, group: GroupState, creation: Creation, *, again: bool = False
    ) -> bool:
        """Whether the journal holds the creation's batch (or there is no journal); `again`:
        whether it holds the creation as it is now (written again if need be)."""
        recorded = creation.batch.recorded
        journal = self._inventory.journal
        if recorded is None or journal is None:
            return True
        try:
            await (journal.persist() if again else asyncio.shield(recorded))
        except JournalError as error:
            if group.creations.get(creation.request_id) is creation:
                failure = CloudError(
                    f"not sent: the creation journal could not record it first: {error}",
                    None,
                    "create_server",
                )
                self._creation_failed(group, creation, failure)
            return False
        return True

    def _creation_acked(self, group: GroupState, creation: Creation, server: Server) -> None:
        creation.batch.successes += 1
        creation.batch.record()
        if group.creations.get(creation.request_id) is not creation:
            return  # a listing already found it by its request tag and counts it
        creation.uuid = server.uuid
        creation.acked_tick = self._inventory.tick()
        creation.state = CreationState.ACKED
        creation.expires = None
        if not self._inventory.serves(group):
            log.warning(
                "node group %s (removed by a reload): its create sent before the reload made "
                "server %s (%s): kept, not served, reported under unconfigured_groups",
                group.name,
                server.name,
                server.uuid,
            )
            self._inventory.journal_changed()
            return
        self._inventory.index(format_provider_id(server.uuid), group)
        if server.uuid in group.servers:
            del group.creations[creation.request_id]
        self._inventory.journal_changed()  # the API has it: listings will show it
        log.info("group %s: created server %s (%s)", group.name, server.name, server.uuid)

    def _creation_in_doubt(
        self, group: GroupState, creation: Creation, error: OutcomeUnknownError
    ) -> None:
        """Sent, and nobody can tell whether the API carried it out: counted (and kept in the
        journal) until a listing shows it or the bound passes, as an adopted create is."""
        creation.batch.in_doubt += 1
        creation.batch.record()
        if group.creations.get(creation.request_id) is not creation:
            return  # a listing already found it by its request tag
        creation.expires = self._clock() + self._inventory.adopted_bound
        log.warning(
            "group %s: %s; counted until a listing shows it, for %gs at most",
            group.name,
            error,
            self._inventory.adopted_bound,
        )

    def _creation_failed(self, group: GroupState, creation: Creation, error: CloudError) -> None:
        batch = creation.batch
        if group.creations.pop(creation.request_id, None) is None:
            # A listing already showed the server under its request tag: it exists after all.
            batch.successes += 1
            batch.record()
            return
        if not self._inventory.serves(group):
            log.warning(
                "node group %s (removed by a reload): creating %s failed: %s",
                group.name,
                creation.name,
                error,
            )
            batch.failures += 1
            batch.record()
            self._inventory.journal_changed()
            return
        self._record_failure(group, creation, error)
        self._inventory.journal_changed()
        if batch.stopped_by is not None:
            # Sent before the batch stopped; its refusal is part of the summary already logged.
            log.debug("group %s: creating %s failed: %s", group.name, creation.name, error)
            return
        log.warning(
            "group %s: creating %s failed (%s): %s", group.name, creation.name, error.code, error
        )
        if refusals.stops_batch(error):
            self._stop_batch(group, batch, error)

    def _record_failure(self, group: GroupState, creation: Creation, error: CloudError) -> None:
        placeholder = Placeholder.from_error(
            creation.request_id, creation.request_id, error, self._clock()
        )
        group.add_placeholder(placeholder)
        self._inventory.index(placeholder_provider_id(placeholder.ident), group)
        batch = creation.batch
        batch.failures += 1
        batch.first_error = batch.first_error or error
        batch.placeholder_ids.append(placeholder.ident)
        batch.record()
        self._observer.creation_failed(group.name, error)

    def _stop_batch(self, group: GroupState, batch: Batch, error: CloudError) -> None:
        """The creates of `batch` not yet sent would be refused the same way: record them as
        failed with the same error (class and code) at once instead of sending them."""
        batch.stopped_by = error
        unsent = [
            c
            for c in group.creations.values()
            if c.batch is batch and c.state is CreationState.QUEUED
        ]
        for creation in unsent:
            del group.creations[creation.request_id]
            self._record_failure(group, creation, error)
        if unsent:
            log.warning(
                "group %s: %d more creation(s) of this scale-up not sent, recorded as failed "
                "(%s) like the first: %s",
                group.name,
                len(unsent),
                error.code,
                error.message,
            )

    def _cancel(self, group: GroupState, creation: Creation) -> None:
        del group.creations[creation.request_id]
        creation.batch.cancelled += 1
        creation.batch.record()
        self._inventory.journal_changed()

    # --- shutdown, leadership lost, groups removed -----------------------------------------

    def retire(self, groups: list[GroupState], why: str) -> None:
        """Groups a reload removed: their creates not sent yet are cancelled and their
        placeholders dropped (nobody serves them any more); those sent are still tracked."""
        for group in groups:
            for ident in list(group.placeholders):
                group.remove_placeholder(ident)
        self._drop(groups, why)

    def drop_queued(self, why: str) -> None:
        """Cancel creations not sent to the cloud yet (shutdown, or leadership lost: the
        next leader counts only servers that exist), saying per group how many."""
        self._drop([*self._inventory.groups.values(), *self._inventory.retired.values()], why)

    def _drop(self, groups: list[GroupState], why: str) -> None:
        for group in groups:
            _, queued = group.cancellable()
            for creation in queued:
                self._cancel(group, creation)
            if queued:
                log.warning(
                    "%s: %d creation(s) of node group %s never sent to the API, abandoned "
                    "(the target size then counts only servers that exist; CA asks again)",
                    why,
                    len(queued),
                    group.name,
                )

    # --- NodeGroupDecreaseTargetSize ------------------------------------------------------

    def decrease_target_size(self, name: str, delta: int) -> None:
        group = self._inventory.group(name)
        if delta >= 0:
            raise InvalidArgument(f"delta must be negative, got {delta}")
        self._inventory.expire(group)
        wanted = -delta
        placeholders, queued = group.cancellable()
        if wanted > len(placeholders) + len(queued):
            raise FailedPrecondition(
                f"decreasing node group {name} by {wanted} would delete existing nodes: "
                f"target size {group.target()} has only {len(placeholders)} failed-creation "
                f"placeholder(s) and {len(queued)} creation(s) not yet sent; "
                "delete nodes through DeleteNodes instead"
            )
        dropped_placeholders = placeholders[:wanted]
        for ident in dropped_placeholders:
            group.remove_placeholder(ident)
        for creation in queued[: wanted - len(dropped_placeholders)]:
            self._cancel(group, creation)
        log.info("group %s: target decreased by %d", name, wanted)
