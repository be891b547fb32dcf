"""The inventory: the cluster's servers as the cloud lists them, per node group, and the
reads over it (Refresh's listing, NodeGroupForNode, NodeGroupTargetSize, NodeGroupNodes).

Owns the node groups (fixed at start; creations.py and deletions.py change their creations,
placeholders and deletions), the engine tick, which listing the inventory comes from and
whether it is stale, why the API was last unreachable, and NodeGroupForNode's index
(creations.py adds to it between rebuilds). Runs on the asyncio loop only: a listing is
applied, and the index rebuilt, without an await in between.

Design decisions (see group.py for how target size is counted):
- Refresh lists `tag:k8s-cluster=<cluster>` once and replaces the inventory. Listings carry
  the engine tick at which they started; an older listing never overwrites a newer one, and
  creations/deletions are reconciled by uuid and request tag against the tick.
- Before the first successful listing, TargetSize answers from what it knows (creations and
  placeholders only); CA calls Refresh first in every loop, and every mutating call loads
  the inventory itself before acting.
- With a creation journal, the first listing of a process (and of each leadership) comes
  after the journal is claimed: creates an earlier process recorded and no listing shows are
  adopted and counted until listed, or until ADOPTED_BOUND_FACTOR x cloudscale.timeoutSeconds
  pass; then they become failed placeholders like any create that failed. No listing is
  applied while the journal cannot be read: a target without them could double a scale-up.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from cloudscale_autoscaler.cloud.errors import (
    AuthenticationError,
    CloudError,
    RateLimitedError,
    UnavailableError,
)
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP, Server, ServerGroup
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.config.types import Config
from cloudscale_autoscaler.engine.background import Background
from cloudscale_autoscaler.engine.errors import CloudUnavailable, GroupNotFound
from cloudscale_autoscaler.engine.group import GroupState
from cloudscale_autoscaler.engine.placement import ServerGroups, managed_by
from cloudscale_autoscaler.engine.providerid import (
    format_provider_id,
    parse_server_uuid,
    placeholder_provider_id,
)
from cloudscale_autoscaler.engine.records import ERROR_CLASS_OTHER, Creation, Placeholder
from cloudscale_autoscaler.journal.entries import Entry
from cloudscale_autoscaler.journal.store import JournalError, JournalStore
from cloudscale_autoscaler.journal.writer import Journal
from cloudscale_autoscaler.observability.echo import clip
from cloudscale_autoscaler.observability.metrics import GroupStats
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

log = logging.getLogger(__name__)

NOT_MANAGED = pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup())
API_UNREACHABLE = "the cloudscale.ch API is unreachable"
# An adopted create is counted for this many client timeouts: the process that sent it gave
# up on its answer after one timeout at most, and the API answers well within another.
ADOPTED_BOUND_FACTOR = 2
UNCONFIRMED = "CREATE_UNCONFIRMED"


class Inventory:
    def __init__(
        self,
        config: Config,
        cloud: Cloud,
        background: Background,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._cloud = cloud
        self._background = background
        self._clock = clock
        self.groups = {group.name: GroupState(group) for group in config.node_groups}
        self.journal: Journal | None = None
        self._claiming: asyncio.Task[None] | None = None
        self.server_groups = ServerGroups(cloud, background, config.cluster)
        self._ticks = itertools.count(1)
        self._applied_start = 0  # start tick of the listing the inventory comes from
        self._stale = False  # set by forget until the next listing applies
        self._by_provider_id: dict[str, pb.NodeGroupForNodeResponse] = {}
        self._ignored_groups: set[str] = set()
        # Journal entries of groups not configured here (yet), by request, until their bound:
        # kept in the journal, and counted if a reload adds the group (a replica whose mounted
        # config lags may take over while the leader scales a new group).
        self._foreign: dict[str, tuple[Entry, float]] = {}
        # Servers per k8s-autoscaler-group tag no configured group has (a group removed from
        # the config, say), from the latest listing: kept, never deleted, shown in /status.
        self.unconfigured: dict[str, int] = {}
        # Why the last listing failed, while the API is unreachable (cleared by a success).
        self.api_down: str | None = None

    def tick(self) -> int:
        """The next engine tick: orders listings, acknowledgements and deletions."""
        return next(self._ticks)

    def forget(self) -> None:
        """Mark the inventory stale (a new leadership: another replica may have changed the
        cloud meanwhile). `loaded` is False until a listing started after this call applies;
        one started before is dropped. The journal is claimed again before that listing."""
        self._applied_start = self.tick()
        self._stale = True
        if self.journal is not None:
            self.journal.forget()

    @property
    def loaded(self) -> bool:
        return self._applied_start > 0 and not self._stale

    # --- Refresh's listing ----------------------------------------------------------------

    async def sync(self, why: str) -> None:
        """List the cluster's servers and apply the listing. It runs as a task of its own: a
        caller that gives up (CA's deadline, a cancelled call) leaves it to finish, so what it
        records about the API is the API's answer or the client's own timeout, never one
        caller's deadline, and the next caller finds the inventory it brought. The journal,
        if any, is claimed first."""
        if self.journal is not None and not self.journal.claimed:
            await self._claim(why)
        listing = asyncio.get_running_loop().create_task(self._list(why, self.tick()))
        self._background.track(listing)
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
            self._background.on_change()

    async def _list(self, why: str, start: int) -> None:
        try:
            # Server groups after servers, never beside: a listing of groups older than the
            # servers' could show a group empty that a server just listed has joined, and
            # tidy() would delete it.
            servers = await self._cloud.list_servers(self._config.cluster)
            server_groups = await self._list_server_groups()
        except CloudError as error:
            problem = api_problem(error)
            if problem == API_UNREACHABLE:
                self.api_down = str(error)
            raise CloudUnavailable(
                f"{why}: {problem}: listing the servers of cluster {self._config.cluster} "
                f"failed: {error}"
            ) from error
        self.api_down = None
        self._apply_listing(servers, start)
        if server_groups is not None:
            self._apply_server_groups(server_groups)

    async def _list_server_groups(self) -> list[ServerGroup] | None:
        """The cluster's server groups, when a node group manages some; None otherwise."""
        if not any(group.placement is not None for group in self.groups.values()):
            return None
        return await self._cloud.list_server_groups(self._config.cluster)

    def _apply_server_groups(self, listed: list[ServerGroup]) -> None:
        cluster = self._config.cluster
        for group in self.groups.values():
            if group.placement is None:
                continue
            group.placement.apply_listing(s for s in listed if managed_by(cluster, group.name, s))
            if not group.has_unconfirmed():  # an earlier process's create may be joining one
                self.server_groups.tidy(group.name, group.placement, group.placed())

    # --- the creation journal -------------------------------------------------------------

    async def _claim(self, why: str) -> None:
        """Claim the journal and adopt what it holds; concurrent callers share one claim."""
        if self._claiming is None or self._claiming.done():
            self._claiming = asyncio.get_running_loop().create_task(self._adopt_journal())
            # Its failure reaches every caller; one left by a cancelled caller is retrieved.
            self._claiming.add_done_callback(lambda task: task.cancelled() or task.exception())
        try:
            await asyncio.shield(self._claiming)
        except JournalError as error:
            raise CloudUnavailable(
                f"{why}: cannot claim the creation journal, so no target is known: {error}"
            ) from error

    async def _adopt_journal(self) -> None:
        assert self.journal is not None
        entries = await self.journal.claim()
        expires = self._clock() + self._adopted_bound
        listed = {name: group.listed_requests() for name, group in self.groups.items()}
        adopted: dict[str, int] = {}
        for entry in entries:
            group = self.groups.get(entry.group)
            if group is None:
                log.warning(
                    "creation journal %s: create %s of node group %s, which is not configured "
                    "here: kept in the journal for %gs, and counted if a reload adds the group",
                    self.journal.where,
                    entry.request,
                    clip(entry.group),
                    self._adopted_bound,
                )
                # Read again at a later claim (our own writes keep it): its bound stays.
                self._foreign.setdefault(entry.request, (entry, expires))
                continue
            known = group.creations.keys() | group.placeholders.keys()
            if entry.request in known or entry.request in listed[group.name]:
                continue
            group.adopt(entry.request, entry.name, entry.at, expires)
            adopted[group.name] = adopted.get(group.name, 0) + 1
        for name, count in adopted.items():
            log.warning(
                "creation journal %s: %d create(s) of node group %s sent by an earlier process "
                "and not listed yet: counted in its target until listed, for %gs at most",
                self.journal.where,
                count,
                name,
                self._adopted_bound,
            )

    @property
    def _adopted_bound(self) -> float:
        return ADOPTED_BOUND_FACTOR * self._config.cloudscale.timeout_seconds

    def use_journal(self, store: JournalStore, holder: str) -> None:
        """Record creates in `store` from now on; before the first listing."""
        self.journal = Journal(store, self._config.cluster, holder, self.unconfirmed_entries)

    def unconfirmed_entries(self) -> list[Entry]:
        """What the journal must hold: every create the API has not answered yet, and the
        entries of groups not configured here until their bound."""
        now = self._clock()
        return [
            Entry(creation.request_id, group.name, creation.name, creation.recorded_at)
            for group in self.groups.values()
            for creation in group.creations.values()
            if creation.uuid is None
        ] + [entry for entry, expires in self._foreign.values() if now < expires]

    def journal_changed(self) -> None:
        if self.journal is not None:
            self.journal.touch()

    async def ensure_loaded(self, why: str) -> None:
        if not self.loaded:
            await self.sync(why)

    def _apply_listing(self, servers: Iterable[Server], start: int) -> None:
        if start < self._applied_start:
            log.debug("dropping a listing older than the inventory (tick %d)", start)
            return
        self._applied_start = start
        self._stale = False
        buckets: dict[str, dict[str, Server]] = {name: {} for name in self.groups}
        unconfigured: dict[str, int] = {}
        cluster = self._config.cluster
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
                unconfigured[group_name] = unconfigured.get(group_name, 0) + 1
                continue
            bucket[server.uuid] = server
        self.unconfigured = unconfigured
        for name, group in self.groups.items():
            group.apply_listing(buckets[name], start)
            self._check_overshoot(group)
        self._rebuild_index()
        self.journal_changed()  # creates it showed are confirmed

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
            self._config.cluster,
        )

    def _ignore_group(self, name: str) -> None:
        if name not in self._ignored_groups:
            self._ignored_groups.add(name)
            log.warning(
                "ignoring servers tagged %s=%s: no such node group is configured", TAG_GROUP, name
            )

    # --- NodeGroupForNode's index ---------------------------------------------------------

    def _rebuild_index(self) -> None:
        index: dict[str, pb.NodeGroupForNodeResponse] = {}
        for group in self.groups.values():
            answer = group.for_node
            for uuid in group.servers:
                index[format_provider_id(uuid)] = answer
            for creation in group.creations.values():
                if creation.uuid is not None:
                    index[format_provider_id(creation.uuid)] = answer
            for ident in group.placeholders:
                index[placeholder_provider_id(ident)] = answer
        self._by_provider_id = index

    def index(self, provider_id: str, group: GroupState) -> None:
        """Add a node the next rebuild will find anyway (an acknowledged creation, a
        placeholder): NodeGroupForNode knows it at once."""
        self._by_provider_id[provider_id] = group.for_node

    def node_group_for_node(self, provider_id: str) -> pb.NodeGroupForNodeResponse:
        """O(1): the exact CCM spelling hits the index directly; other spellings are parsed."""
        answer = self._by_provider_id.get(provider_id)
        if answer is not None:
            return answer
        uuid = parse_server_uuid(provider_id)
        if uuid is None:
            return NOT_MANAGED
        return self._by_provider_id.get(format_provider_id(uuid), NOT_MANAGED)

    def group_name_of(self, provider_id: str) -> str:
        return str(self.node_group_for_node(provider_id).nodeGroup.id)

    def provider_index(self) -> Mapping[str, pb.NodeGroupForNodeResponse]:
        """NodeGroupForNode's exact-spelling index. A rebuild replaces the mapping; between
        rebuilds entries are only added (acknowledged creations, placeholders)."""
        return self._by_provider_id

    # --- groups ---------------------------------------------------------------------------

    def reconfigure(self, config: Config) -> dict[str, int]:
        """Take a reloaded config (same cluster): groups added, changed, removed; the groups
        that went, with the servers each still had (kept). No await: atomic between calls."""
        old = self.groups
        self._config = config
        self.groups = {}
        for group_config in config.node_groups:
            group = old.get(group_config.name)
            if group is None:
                group = GroupState(group_config)
            else:
                group.reconfigure(group_config)
            self.groups[group.name] = group
        self._ignored_groups -= self.groups.keys()  # a group back again is no longer ignored
        self._adopt_foreign(old.keys())
        self._rebuild_index()
        return {name: len(group.servers) for name, group in old.items() if name not in self.groups}

    def _adopt_foreign(self, before: Iterable[str]) -> None:
        """Count the kept journal entries of the groups a reload added, within their bound."""
        added = self.groups.keys() - set(before)
        now = self._clock()
        for request, (entry, expires) in list(self._foreign.items()):
            if now >= expires:
                del self._foreign[request]
            elif entry.group in added:
                del self._foreign[request]
                self.groups[entry.group].adopt(entry.request, entry.name, entry.at, expires)
                log.warning(
                    "creation journal: create %s of node group %s, added by this reload, sent "
                    "by an earlier process and not listed yet: counted in its target",
                    entry.request,
                    entry.group,
                )

    def group(self, name: str) -> GroupState:
        group = self.groups.get(name)
        if group is None:
            known = ", ".join(self.groups) or "none"
            raise GroupNotFound(
                f"node group {clip(name)!r} is not configured (configured: {known})"
            )
        return group

    def expire(self, group: GroupState) -> None:
        now = self._clock()
        expired = group.expire_adopted(now)
        for creation in expired:
            self._unconfirmed(group, creation, now)
        if expired:
            self.journal_changed()
        group.expire_placeholders(now, self._config.placeholder_expiry_seconds)

    def _unconfirmed(self, group: GroupState, creation: Creation, now: float) -> None:
        """An adopted create no listing showed in time: its process died before sending it,
        or the API refused it. A failed placeholder, so CA deletes it and plans again."""
        message = (
            f"create {creation.request_id} ({creation.name}), recorded {creation.recorded_at} by "
            f"an earlier process, was not listed within {self._adopted_bound:g}s: taken for "
            "never made"
        )
        log.warning("group %s: %s", group.name, message)
        placeholder = Placeholder(
            creation.request_id, creation.request_id, UNCONFIRMED, message, ERROR_CLASS_OTHER, now
        )
        group.add_placeholder(placeholder)
        self.index(placeholder_provider_id(placeholder.ident), group)

    def owner_of(self, uuid: str) -> str | None:
        for name, group in self.groups.items():
            if uuid in group.servers:
                return name
        return None

    # --- NodeGroupTargetSize, NodeGroupNodes, the metrics ---------------------------------

    def target_size(self, name: str) -> int:
        group = self.group(name)
        self.expire(group)
        return group.target()

    def nodes(self, name: str) -> pb.NodeGroupNodesResponse:
        group = self.group(name)
        self.expire(group)
        return pb.NodeGroupNodesResponse(instances=group.instances(time.time()))

    def settled_targets(self) -> dict[str, int]:
        """Target sizes that only a change of state can move: groups without placeholders
        (their expiry changes the target with time alone)."""
        return {name: g.target() for name, g in self.groups.items() if not g.placeholders}

    def group_stats(self) -> list[GroupStats]:
        """Per-group numbers for the metrics collector (read at scrape time)."""
        stats = []
        for group in self.groups.values():
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
                    server_groups=0 if group.placement is None else group.placement.count,
                )
            )
        return stats


def api_problem(error: CloudError) -> str:
    """What a failed listing says about the API, for CA's log (it shows our message)."""
    if isinstance(error, AuthenticationError):
        return "the cloudscale.ch API rejected the token"
    if isinstance(error, UnavailableError | RateLimitedError) or error.status is None:
        return API_UNREACHABLE
    return "the cloudscale.ch API refused the listing"
