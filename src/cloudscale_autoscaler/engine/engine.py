"""The engine: node groups over the cloud, as CA's externalgrpc calls need them.

Runs on the asyncio loop only, no threads: state changes between two awaits are atomic, so
no locks are needed. Every check-then-act sequence below keeps its check and its act in one
synchronous stretch.

Design decisions (see group.py for how target size is counted):
- Refresh lists `tag:k8s-cluster=<cluster>` once and replaces the inventory. Listings carry
  the engine tick at which they started; an older listing never overwrites a newer one, and
  creations/deletions are reconciled by uuid and request tag against the tick.
- IncreaseSize bumps the target at once, starts creations in the background (bounded by
  maxConcurrentCreates) and waits at most `increaseSizeWait` for the verdict: the first
  success, or every attempt failing. If all failed with a permanent refusal (bad token,
  unknown image), the bump is rolled back and the error returned; quota and capacity refusals
  always become placeholders of class OutOfResources (see refusals.py). The first quota,
  capacity or permanent refusal stops the batch: creates not yet sent become placeholders
  with the same error instead of being sent.
- DeleteNodes re-lists the cluster before deleting, so only servers that the cloud lists,
  right now, with this cluster's and this group's tags are ever deleted. Each server is
  tagged TAG_DELETION before its DELETE; Refresh finishes deletions of tagged servers that
  nobody carries out (after a restart, or a failed DELETE).
- Before the first successful listing, TargetSize answers from what it knows (creations and
  placeholders only); CA calls Refresh first in every loop, and every mutating call loads
  the inventory itself before acting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from cloudscale_autoscaler.cloud.errors import (
    AuthenticationError,
    CloudError,
    RateLimitedError,
    UnavailableError,
)
from cloudscale_autoscaler.cloud.models import (
    TAG_CLUSTER,
    TAG_DELETION,
    TAG_GROUP,
    TAG_REQUEST,
    InterfaceRequest,
    Server,
    ServerSpec,
)
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.config import Config
from cloudscale_autoscaler.echo import clip
from cloudscale_autoscaler.engine import names, options, refusals, spec
from cloudscale_autoscaler.engine.catalog import Catalog
from cloudscale_autoscaler.engine.errors import (
    CloudUnavailable,
    FailedPrecondition,
    GroupNotFound,
    InvalidArgument,
    Unimplemented,
)
from cloudscale_autoscaler.engine.group import (
    DeleteServer,
    GroupState,
    NodeRef,
    RemovePlaceholder,
    Resolved,
)
from cloudscale_autoscaler.engine.networks import NetworkResolver
from cloudscale_autoscaler.engine.pricing import Pricer
from cloudscale_autoscaler.engine.providerid import (
    format_provider_id,
    parse_server_uuid,
    placeholder_provider_id,
)
from cloudscale_autoscaler.engine.records import Batch, Creation, CreationState, Placeholder
from cloudscale_autoscaler.engine.userdata import UserDataError
from cloudscale_autoscaler.metrics import GroupStats
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

log = logging.getLogger(__name__)

NOT_MANAGED = pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup())
# Distinct option-defaults CA sends are few (one per CA version); bound the cache anyway.
_OPTIONS_CACHE_LIMIT = 32


class Engine:
    def __init__(
        self,
        config: Config,
        cloud: Cloud,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._cloud = cloud
        self._clock = clock
        self._groups = {group.name: GroupState(group) for group in config.node_groups}
        self._catalog = Catalog(config, cloud)
        self._networks = NetworkResolver(cloud)
        # None without `pricing`: the pricing RPCs then answer UNIMPLEMENTED.
        self.pricing = (
            Pricer(config, config.pricing, self._catalog, self._group_name_of)
            if config.pricing is not None
            else None
        )
        self._create_slots = asyncio.Semaphore(config.cloudscale.max_concurrent_creates)
        self._ticks = itertools.count(1)
        self._applied_start = 0  # start tick of the listing the inventory comes from
        self._stale = False  # set by forget_inventory until the next listing applies
        self._by_provider_id: dict[str, pb.NodeGroupForNodeResponse] = {}
        self._ignored_groups: set[str] = set()
        self._options: dict[tuple[str, bytes], pb.NodeGroupAutoscalingOptionsResponse] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        # Why the last listing failed, while the API is unreachable (cleared by a success).
        self._api_down: str | None = None
        # Unix time of the last successful Refresh, for the metrics endpoint; 0 = never.
        self.last_refresh_unix = 0.0
        # Called when a background task (a creation, a deletion) finished and may have changed
        # the state; changes made inside an RPC are published by the transport after the call.
        self.on_change: Callable[[], None] = lambda: None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, timeout_seconds: float = 10.0) -> None:
        """Load the inventory so targets are right from the first call. Neither failure nor
        a slow API is fatal (bounded, so serving starts): CA's Refresh and every mutation
        load it again."""
        try:
            await self.load(timeout_seconds)
        except (CloudUnavailable, TimeoutError) as error:
            log.warning(
                "initial inventory load failed, retrying on Refresh: %s", str(error) or "timed out"
            )

    async def aclose(self, grace_seconds: float = 10.0) -> None:
        """Stop: drop creations never sent, give requests already out `grace_seconds` to
        finish (their servers carry our tags, so a restart finds them either way)."""
        self._closing = True
        self.drop_queued_creations("shutting down")
        pending = [task for task in self._tasks if not task.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace_seconds)
            for task in late:
                task.cancel()
            if late:
                log.warning("shutdown: abandoned %d cloud request(s) still in flight", len(late))
                await asyncio.wait(late)

    def drop_queued_creations(self, why: str) -> None:
        """Cancel creations not sent to the cloud yet (shutdown, or leadership lost: the
        next leader counts only servers that exist), saying per group how many."""
        for group in self._groups.values():
            _, queued = group.cancellable()
            for creation in queued:
                self._cancel_creation(group, creation)
            if queued:
                log.warning(
                    "%s: %d creation(s) of node group %s never sent to the API, abandoned "
                    "(the target size then counts only servers that exist; CA asks again)",
                    why,
                    len(queued),
                    group.name,
                )

    async def load(self, timeout_seconds: float = 10.0) -> None:
        """Load the inventory now; raises CloudUnavailable or TimeoutError."""
        await asyncio.wait_for(self.refresh(), timeout_seconds)

    def forget_inventory(self) -> None:
        """Mark the inventory stale (a new leadership: another replica may have changed the
        cloud meanwhile). `loaded` is False until a listing started after this call applies;
        one started before is dropped."""
        self._applied_start = next(self._ticks)
        self._stale = True

    @property
    def loaded(self) -> bool:
        return self._applied_start > 0 and not self._stale

    # --- inventory ------------------------------------------------------------------------

    async def refresh(self) -> None:
        await self._sync_inventory("Refresh")
        if not self._closing:
            self._resume_deletions()
        await self._catalog.refresh()
        for group in self._groups.values():
            self._expire(group)
        self.last_refresh_unix = time.time()

    async def _sync_inventory(self, why: str) -> None:
        """List the cluster's servers and apply the listing. It runs as a task of its own: a
        caller that gives up (CA's deadline, a cancelled call) leaves it to finish, so what it
        records about the API is the API's answer or the client's own timeout, never one
        caller's deadline, and the next caller finds the inventory it brought."""
        listing = asyncio.get_running_loop().create_task(self._list(why, next(self._ticks)))
        self._tasks.add(listing)
        listing.add_done_callback(self._tasks.discard)
        try:
            await asyncio.shield(listing)
        except asyncio.CancelledError:
            if not listing.done():
                listing.add_done_callback(self._listing_abandoned)
            raise

    def _listing_abandoned(self, listing: asyncio.Task[None]) -> None:
        """Its caller was gone: retrieve its outcome (a failure is already recorded) and
        publish what it applied."""
        if not listing.cancelled() and listing.exception() is None:
            self.on_change()

    async def _list(self, why: str, start: int) -> None:
        try:
            servers = await self._cloud.list_servers(self.config.cluster)
        except CloudError as error:
            problem = _api_problem(error)
            if problem == API_UNREACHABLE:
                self._api_down = str(error)
            raise CloudUnavailable(
                f"{why}: {problem}: listing the servers of cluster {self.config.cluster} "
                f"failed: {error}"
            ) from error
        self._api_down = None
        self._apply_listing(servers, start)

    async def _ensure_loaded(self, why: str) -> None:
        if not self.loaded:
            await self._sync_inventory(why)

    def _apply_listing(self, servers: Iterable[Server], start: int) -> None:
        if start < self._applied_start:
            log.debug("dropping a listing older than the inventory (tick %d)", start)
            return
        self._applied_start = start
        self._stale = False
        buckets: dict[str, dict[str, Server]] = {name: {} for name in self._groups}
        cluster = self.config.cluster
        for server in servers:
            tags = server.tags
            # The client filters by cluster already; checked again because this inventory is
            # what DeleteNodes trusts.
            if tags.get(TAG_CLUSTER) != cluster:
                continue
            group_name = tags.get(TAG_GROUP)
            if group_name is None:
                continue
            bucket = buckets.get(group_name)
            if bucket is None:
                self._ignore_group(group_name)
                continue
            bucket[server.uuid] = server
        for name, group in self._groups.items():
            group.apply_listing(buckets[name], start)
            self._check_overshoot(group)
        self._rebuild_index()

    def _check_overshoot(self, group: GroupState) -> None:
        """Warn once per episode when a group holds more servers than its maxSize and some
        were created elsewhere: this provider never goes above maxSize, so another writer
        does (two providers for one cluster, e.g. replicas without leader election)."""
        above, foreign = group.above_max(), group.foreign_servers()
        if not above or not foreign:
            group.overshoot_warned = False
            return
        if group.overshoot_warned:
            return
        group.overshoot_warned = True
        log.warning(
            "node group %s has %d server(s) above its maxSize %d, and %d of its servers were "
            "not created by this provider since it started: another provider may be creating "
            "servers for cluster %s (or maxSize was lowered); run one provider per cluster, "
            "or enable kubernetes.leaderElection",
            group.name,
            above,
            group.config.max_size,
            foreign,
            self.config.cluster,
        )

    def _ignore_group(self, name: str) -> None:
        if name not in self._ignored_groups:
            self._ignored_groups.add(name)
            log.warning(
                "ignoring servers tagged %s=%s: no such node group is configured", TAG_GROUP, name
            )

    def _rebuild_index(self) -> None:
        index: dict[str, pb.NodeGroupForNodeResponse] = {}
        for group in self._groups.values():
            answer = group.for_node
            for uuid in group.servers:
                index[format_provider_id(uuid)] = answer
            for creation in group.creations.values():
                if creation.uuid is not None:
                    index[format_provider_id(creation.uuid)] = answer
            for ident in group.placeholders:
                index[placeholder_provider_id(ident)] = answer
        self._by_provider_id = index

    def _group(self, name: str) -> GroupState:
        group = self._groups.get(name)
        if group is None:
            known = ", ".join(self._groups) or "none"
            raise GroupNotFound(
                f"node group {clip(name)!r} is not configured (configured: {known})"
            )
        return group

    def _expire(self, group: GroupState) -> None:
        group.expire_placeholders(self._clock(), self.config.placeholder_expiry_seconds)

    def _owner_of(self, uuid: str) -> str | None:
        for name, group in self._groups.items():
            if uuid in group.servers:
                return name
        return None

    # --- reads --------------------------------------------------------------------------------

    def node_group_for_node(self, provider_id: str) -> pb.NodeGroupForNodeResponse:
        """O(1): the exact CCM spelling hits the index directly; other spellings are parsed."""
        answer = self._by_provider_id.get(provider_id)
        if answer is not None:
            return answer
        uuid = parse_server_uuid(provider_id)
        if uuid is None:
            return NOT_MANAGED
        return self._by_provider_id.get(format_provider_id(uuid), NOT_MANAGED)

    def _group_name_of(self, provider_id: str) -> str:
        return str(self.node_group_for_node(provider_id).nodeGroup.id)

    def provider_index(self) -> Mapping[str, pb.NodeGroupForNodeResponse]:
        """NodeGroupForNode's exact-spelling index. A rebuild replaces the mapping; between
        rebuilds entries are only added (acknowledged creations, placeholders)."""
        return self._by_provider_id

    def settled_targets(self) -> dict[str, int]:
        """Target sizes that only a change of state can move: groups without placeholders
        (their expiry changes the target with time alone)."""
        return {name: g.target() for name, g in self._groups.items() if not g.placeholders}

    def group_stats(self) -> list[GroupStats]:
        """Per-group numbers for the metrics collector (read at scrape time)."""
        stats = []
        for group in self._groups.values():
            pending = sum(1 for _ in group.pending_creations())
            target = group.target()
            stats.append(
                GroupStats(
                    name=group.name,
                    min_size=group.config.min_size,
                    max_size=group.config.max_size,
                    target_size=target,
                    servers=target - pending - len(group.placeholders),
                    creations_in_flight=pending,
                    placeholders=len(group.placeholders),
                    servers_above_max_size=group.above_max(),
                )
            )
        return stats

    def target_size(self, name: str) -> int:
        group = self._group(name)
        self._expire(group)
        return group.target()

    def nodes(self, name: str) -> pb.NodeGroupNodesResponse:
        group = self._group(name)
        self._expire(group)
        return pb.NodeGroupNodesResponse(instances=group.instances(time.time()))

    async def template_node_info(self, name: str) -> pb.NodeGroupTemplateNodeInfoResponse:
        return await self._catalog.template(self._group(name).config)

    async def gpu_types(self) -> list[str]:
        return await self._catalog.gpu_types()

    def api_failure_since(self, since: float) -> str | None:
        """Why the API gave no answer yet, if an attempt failed after `since`
        (time.monotonic()) and its client is retrying: what a caller that cannot wait longer
        is told instead of "slow"."""
        error = self._cloud.failed_since(since)
        return None if error is None else f"{_api_problem(error)}: {error}"

    def autoscaling_options(
        self, name: str, defaults: pb.NodeGroupAutoscalingOptions
    ) -> pb.NodeGroupAutoscalingOptionsResponse:
        group = self._group(name)
        overrides = group.config.autoscaling_options
        if overrides is None:
            raise Unimplemented(f"node group {name} has no autoscalingOptions: CA's defaults apply")
        # One answer per group when nothing comes from the defaults, else one per defaults.
        key_defaults = (
            defaults.SerializeToString(deterministic=True)
            if options.depends_on_defaults(overrides)
            else b""
        )
        key = (name, key_defaults)
        cached = self._options.get(key)
        if cached is None:
            if len(self._options) >= _OPTIONS_CACHE_LIMIT:
                self._options.clear()
            cached = self._options[key] = options.build_options(overrides, defaults)
        return cached

    # --- increase -------------------------------------------------------------------------

    async def increase_size(self, name: str, delta: int) -> None:
        group = self._group(name)
        if delta <= 0:
            raise InvalidArgument(f"delta must be positive, got {delta}")
        if self._closing:
            raise CloudUnavailable("shutting down: not starting new creations")
        await self._ensure_loaded(f"IncreaseSize {name}")
        if self._api_down is not None:
            # Creations would only fail into placeholders once the client's retries run out:
            # refuse now, target untouched (CA backs the group off and retries later).
            raise CloudUnavailable(
                f"IncreaseSize {name}: {API_UNREACHABLE} (the last listing failed: "
                f"{self._api_down}); not creating servers, target size unchanged"
            )
        interfaces = await self._networks.interfaces(group.config)
        await self._catalog.ensure()  # the flavor decides labels and refusals below
        # From here to the spawns there is no await: the max check and the bump are atomic.
        problem = self._catalog.creation_problem(group.config)
        if problem is not None:
            raise FailedPrecondition(problem)
        self._expire(group)
        target = group.target()
        if target + delta > group.config.max_size:
            raise FailedPrecondition(
                f"increasing node group {name} by {delta} would exceed its maxSize "
                f"{group.config.max_size} (target size is {target})"
            )
        specs = self._new_specs(group, delta, interfaces)
        batch = Batch(delta)
        for server_spec in specs:
            self._start_creation(group, batch, server_spec)
        log.info(
            "group %s: creating %d server(s), target %d -> %d", name, delta, target, target + delta
        )
        await self._verdict(group, batch)

    def _new_specs(
        self,
        group: GroupState,
        count: int,
        interfaces: tuple[InterfaceRequest, ...] | None = None,
    ) -> list[ServerSpec]:
        """`count` create requests with names unique in the group (listed or in flight)."""
        cluster = self.config.cluster
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

    def _start_creation(self, group: GroupState, batch: Batch, server_spec: ServerSpec) -> None:
        request_id = server_spec.tags[TAG_REQUEST]
        creation = Creation(request_id, server_spec.name, batch)
        group.issued.add(request_id)
        group.creations[request_id] = creation
        self._spawn(self._create(group, creation, server_spec))

    async def _verdict(self, group: GroupState, batch: Batch) -> None:
        try:
            await asyncio.wait_for(batch.settled.wait(), self.config.increase_size_wait_seconds)
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

    async def _create(self, group: GroupState, creation: Creation, server_spec: ServerSpec) -> None:
        async with self._create_slots:
            if group.creations.get(creation.request_id) is not creation:
                return  # cancelled, or already listed, while it waited for a slot
            creation.state = CreationState.SENDING
            try:
                server = await self._cloud.create_server(server_spec)
            except CloudError as error:
                self._creation_failed(group, creation, error)
                return
            except Exception as error:  # a bug must still leave an accounted placeholder
                log.exception("group %s: creating %s crashed", group.name, creation.name)
                failure = CloudError(f"internal error: {error!r}", None, "create_server")
                self._creation_failed(group, creation, failure)
                return
        self._creation_acked(group, creation, server)

    def _creation_acked(self, group: GroupState, creation: Creation, server: Server) -> None:
        creation.batch.successes += 1
        creation.batch.record()
        if group.creations.get(creation.request_id) is not creation:
            return  # a listing already found it by its request tag and counts it
        creation.uuid = server.uuid
        creation.acked_tick = next(self._ticks)
        creation.state = CreationState.ACKED
        self._by_provider_id[format_provider_id(server.uuid)] = group.for_node
        if server.uuid in group.servers:
            del group.creations[creation.request_id]
        log.info("group %s: created server %s (%s)", group.name, server.name, server.uuid)

    def _creation_failed(self, group: GroupState, creation: Creation, error: CloudError) -> None:
        batch = creation.batch
        if group.creations.pop(creation.request_id, None) is None:
            # A listing already showed the server under its request tag: it exists after all.
            batch.successes += 1
            batch.record()
            return
        self._record_failure(group, creation, error)
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
        self._by_provider_id[placeholder_provider_id(placeholder.ident)] = group.for_node
        batch = creation.batch
        batch.failures += 1
        batch.first_error = batch.first_error or error
        batch.placeholder_ids.append(placeholder.ident)
        batch.record()

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

    def _cancel_creation(self, group: GroupState, creation: Creation) -> None:
        del group.creations[creation.request_id]
        creation.batch.cancelled += 1
        creation.batch.record()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self.on_change())
        return task

    # --- decrease -------------------------------------------------------------------------

    def decrease_target_size(self, name: str, delta: int) -> None:
        group = self._group(name)
        if delta >= 0:
            raise InvalidArgument(f"delta must be negative, got {delta}")
        self._expire(group)
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
            self._cancel_creation(group, creation)
        log.info("group %s: target decreased by %d", name, wanted)

    # --- delete ---------------------------------------------------------------------------

    async def delete_nodes(self, name: str, nodes: Sequence[NodeRef]) -> None:
        group = self._group(name)
        if not nodes:
            raise InvalidArgument("no nodes given: expected at least one node to delete")
        # Re-list before deleting: a server is deleted only if the cloud lists it NOW with this
        # cluster's and this group's tags (tags may have changed since the last Refresh).
        await self._sync_inventory(f"DeleteNodes {name}")
        # No await from here until the deletions are started: checks and marks are atomic.
        self._expire(group)
        resolved = _unique([group.resolve(node, self._owner_of) for node in nodes])
        self._check_min_size(group, resolved)
        waits: list[tuple[NodeRef, asyncio.Task[None]]] = []
        for item in resolved:
            if isinstance(item, RemovePlaceholder):
                group.remove_placeholder(item.ident)
            elif isinstance(item, DeleteServer):
                waits.append((item.node, self._start_deletion(group, item.uuid)))
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

    def _start_deletion(self, group: GroupState, uuid: str) -> asyncio.Task[None]:
        task = group.deleting.get(uuid)
        if task is None:
            task = group.deleting[uuid] = self._spawn(self._delete(group, uuid))
            # Resumed deletions have no waiter: their failure is logged, not left unretrieved.
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task

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
            self.on_change()  # the tag changes the target: republish before the DELETE ends

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

    def _resume_deletions(self) -> None:
        """Finish deletions requested before a restart (or whose DELETE failed): servers
        listed with the deletion tag that nobody is deleting."""
        for group in self._groups.values():
            for uuid in group.marked_for_deletion():
                log.info(
                    "group %s: finishing the deletion of server %s (tagged %s)",
                    group.name,
                    uuid,
                    TAG_DELETION,
                )
                self._start_deletion(group, uuid)

    async def _delete(self, group: GroupState, uuid: str) -> None:
        try:
            await self._tagged_delete(group, uuid)
        except BaseException as error:
            group.deleting.pop(uuid, None)
            if isinstance(error, CloudError):
                log.warning("group %s: deleting server %s failed: %s", group.name, uuid, error)
            raise
        group.deleting.pop(uuid, None)
        group.deleted[uuid] = next(self._ticks)
        group.gone.add(uuid)
        for request_id, creation in list(group.creations.items()):
            if creation.uuid == uuid:
                del group.creations[request_id]
        log.info("group %s: deleted server %s", group.name, uuid)


API_UNREACHABLE = "the cloudscale.ch API is unreachable"


def _refused(error: CloudError) -> bool:
    """The API answered 4xx: it certainly did not carry the request out (429s were retried)."""
    return error.status is not None and 400 <= error.status < 500


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _api_problem(error: CloudError) -> str:
    """What a failed listing says about the API, for CA's log (it shows our message)."""
    if isinstance(error, AuthenticationError):
        return "the cloudscale.ch API rejected the token"
    if isinstance(error, UnavailableError | RateLimitedError) or error.status is None:
        return API_UNREACHABLE
    return "the cloudscale.ch API refused the listing"


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
