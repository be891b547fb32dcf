"""The inventory: the cluster's servers as the cloud lists them, per node group, and the
reads over it (Refresh's listing, NodeGroupForNode, NodeGroupTargetSize, NodeGroupNodes).

Owns the node groups (a reload replaces the config's; creations.py and deletions.py change
their creations, placeholders and deletions), the groups a reload removed while creates of
theirs were in flight (`retired`: still tracked and reported, never served), the engine tick,
which listing the inventory comes from and whether it is stale, why the API was last
unreachable, and NodeGroupForNode's index (creations.py adds to it between rebuilds). Runs
on the asyncio loop only: a listing is applied, and the index rebuilt, without an await in
between.

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
  pass; then they become failed placeholders like any create that failed. A create of this
  process whose outcome is unknown (sent, never answered) is counted the same way. No listing
  is applied while the journal cannot be read: a target without them could double a scale-up.
- A group a reload removes is never served again, and nothing more of it is sent (its queued
  creates are cancelled, creations.py). Its servers are kept; they, its creates still in
  flight and its managed server groups are reported (`removed_groups`) until none is left.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

from cloudscale_autoscaler.cloud.errors import (
    AuthenticationError,
    CloudError,
    RateLimitedError,
    UnavailableError,
)
from cloudscale_autoscaler.cloud.models import (
    TAG_CLUSTER,
    TAG_GROUP,
    TAG_MANAGED,
    Server,
    ServerGroup,
)
from cloudscale_autoscaler.cloud.protocol import Cloud, Fence
from cloudscale_autoscaler.engine.background import Background
from cloudscale_autoscaler.engine.errors import CloudUnavailable, GroupNotFound
from cloudscale_autoscaler.engine.group import GroupState
from cloudscale_autoscaler.engine.placement import MANAGED, ServerGroups
from cloudscale_autoscaler.engine.providerid import (
    format_provider_id,
    parse_server_uuid,
    placeholder_provider_id,
)
from cloudscale_autoscaler.engine.records import ERROR_CLASS_OTHER, Creation, Placeholder
from cloudscale_autoscaler.engine.status import RemovedGroup
from cloudscale_autoscaler.journal.entries import Entry
from cloudscale_autoscaler.journal.store import JournalError, JournalStore
from cloudscale_autoscaler.journal.writer import Journal
from cloudscale_autoscaler.observability.echo import clip
from cloudscale_autoscaler.observability.metrics import GroupStats
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.settings.types import Config

log = logging.getLogger(__name__)

NOT_MANAGED = pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup())
API_UNREACHABLE = "the cloudscale.ch API is unreachable"
# A create of unknown outcome (adopted from the journal, or unanswered) is counted for this
# many client timeouts (cloudscale.timeoutSeconds, T). No attempt of a create starts once its
# sender's fence closed (its Lease lapsed before a successor could take it over, or its
# process died), and every attempt is abandoned T after it began: so T after the successor
# claimed the journal no request of the old holder is still under way, and the API carries out
# one it received within the T it was given to answer (docs/deployment.md).
ADOPTED_BOUND_FACTOR = 2
UNCONFIRMED = "CREATE_UNCONFIRMED"


class Inventory:
    def __init__(
        self,
        config: Config,
        cloud: Cloud,
        background: Background,
        clock: Callable[[], float],
        fence: Fence,
        *,
        tidy: bool = True,
    ) -> None:
        """`tidy` False: a reading inventory (`smoke`'s), which never lists the server groups
        of node groups that manage none, so never deletes one."""
        self._config = config
        self._cloud = cloud
        self._background = background
        self._clock = clock
        self._fence = fence
        self.groups = {group.name: GroupState(group) for group in config.node_groups}
        # Groups a reload removed while creates of theirs were in flight, by name.
        self.retired: dict[str, GroupState] = {}
        self.journal: Journal | None = None
        self._claiming: asyncio.Task[None] | None = None
        self._ticks = itertools.count(1)
        self.server_groups = ServerGroups(cloud, background, config.cluster, fence, self.tick)
        # Whether the next listing also lists server groups: the first one does, to find the
        # managed ones of node groups configured no more; later ones while there are any.
        self._list_server_groups_next = tidy
        self._tidy = tidy
        self._applied_start = 0  # start tick of the listing the inventory comes from
        self._applied_at = -math.inf  # and when it began, by self._clock
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
        # (until, why) while scale-ups are held: the journal could not be read whole.
        self._held: tuple[float, str] | None = None

    def tick(self) -> int:
        """The next engine tick: orders listings, acknowledgements and deletions."""
        return next(self._ticks)

    def forget(self) -> None:
        """Mark the inventory stale (a new leadership: another replica may have changed the
        cloud meanwhile). `loaded` is False until a listing started after this call applies;
        one started before is dropped. The journal is claimed again before that listing."""
        self._applied_start = self.tick()
        self._stale = True
        self._list_server_groups_next = self._tidy
        if self._claiming is not None:
            self._claiming.cancel()  # a claim under way must not finish for a lost leadership
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
        started = time.monotonic()
        listing = asyncio.get_running_loop().create_task(
            self._list(why, self.tick(), self._clock())
        )
        self._background.track(listing)
        try:
            await asyncio.shield(listing)
        except asyncio.CancelledError:
            if not listing.done():
                listing.add_done_callback(self._listing_abandoned)
                self._note_retrying(started)
            raise

    def _note_retrying(self, started: float) -> None:
        """A caller gave up on a listing the client is retrying after the API failed: the
        API is down as far as anyone can tell until that listing ends (it sets or clears
        api_down then). Without this an IncreaseSize right after a Refresh that timed out
        on a down API would be accepted, and its creates would fail into the outage."""
        error = self._cloud.failed_since(started)
        if error is not None and api_problem(error) == API_UNREACHABLE:
            self.api_down = f"{error}; still retrying"

    def _listing_abandoned(self, listing: asyncio.Task[None]) -> None:
        """Its caller was gone: retrieve its outcome (a failure is already recorded) and
        publish what it applied."""
        if not listing.cancelled() and listing.exception() is None:
            self._background.on_change()

    async def _list(self, why: str, start: int, started_at: float) -> None:
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
        if not self._apply_listing(servers, start):
            return
        self._applied_at = started_at
        if server_groups is not None:
            self._apply_server_groups(server_groups, start)

    async def _list_server_groups(self) -> list[ServerGroup] | None:
        """The cluster's server groups, when a node group manages some (or managed ones of
        node groups that manage none may exist); None otherwise."""
        wanted = self._list_server_groups_next or any(
            group.placement is not None for group in self._all_groups()
        )
        if not wanted:
            return None
        return await self._cloud.list_server_groups(self._config.cluster)

    def _apply_server_groups(self, listed: list[ServerGroup], start: int) -> None:
        """Each node group's managed server groups from a listing begun at `start` (applied
        only if its server listing was); the empty ones deleted after the grace."""
        by_group = self._managed(listed)
        now, grace = self._clock(), self.adopted_bound
        orphans: dict[str, list[ServerGroup]] = {}
        for name, server_groups in by_group.items():
            group = self.groups.get(name) or self.retired.get(name)
            if group is None or group.placement is None:
                orphans[name] = server_groups
        for group in self._all_groups():
            if group.placement is None:
                continue
            group.placement.apply_listing(by_group.get(group.name, ()), start)
            if not group.has_unconfirmed():  # an earlier process's create may be joining one
                self.server_groups.tidy(group.name, group.placement, group.placed(), now, grace)
        self.server_groups.apply_orphans(orphans, start)
        for name, placement in self.server_groups.orphans.items():
            group = self.groups.get(name) or self.retired.get(name)
            if group is None or not group.creations:  # nothing of its may be joining one
                self.server_groups.tidy(name, placement, {}, now, grace)
        self._list_server_groups_next = self._tidy and bool(orphans)

    def _managed(self, listed: list[ServerGroup]) -> dict[str, list[ServerGroup]]:
        """The listed server groups this provider manages, by node group name."""
        by_group: dict[str, list[ServerGroup]] = {}
        cluster = self._config.cluster
        for server_group in listed:
            tags = server_group.tags
            name = tags.get(TAG_GROUP)
            if tags.get(TAG_CLUSTER) == cluster and tags.get(TAG_MANAGED) == MANAGED and name:
                by_group.setdefault(name, []).append(server_group)
        return by_group

    def _all_groups(self) -> list[GroupState]:
        """The configured groups and the retired ones."""
        return [*self.groups.values(), *self.retired.values()]

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
        claim = await self.journal.claim()
        entries = claim.entries
        expires = self._clock() + self.adopted_bound
        if claim.doubt is not None:
            self._hold(claim.doubt, expires)
        listed = {name: group.listed_requests() for name, group in self.groups.items()}
        adopted: dict[str, int] = {}
        for entry in entries:
            group = self.groups.get(entry.group)
            if group is None and entry.group in self.retired:
                continue  # our own create of a group a reload removed: tracked there
            if group is None:
                log.warning(
                    "creation journal %s: create %s of node group %s, which is not configured "
                    "here: kept in the journal for %gs, and counted if a reload adds the group",
                    self.journal.where,
                    entry.request,
                    clip(entry.group),
                    self.adopted_bound,
                )
                # Read again at a later claim (our own writes keep it): its bound stays.
                self._foreign.setdefault(entry.request, (entry, expires))
                continue
            known = group.creations.keys() | group.placeholders.keys()
            if entry.request in known or entry.request in listed[group.name]:
                continue
            group.adopt(entry, expires)
            adopted[group.name] = adopted.get(group.name, 0) + 1
        for name, count in adopted.items():
            log.warning(
                "creation journal %s: %d create(s) of node group %s sent by an earlier process "
                "and not listed yet: counted in its target until listed, for %gs at most",
                self.journal.where,
                count,
                name,
                self.adopted_bound,
            )

    def _hold(self, doubt: str, until: float) -> None:
        """No scale-up until `until`: creates the journal held are unknown, and by then every
        one of them still under way has been carried out and is listed."""
        self._held = (until, doubt)
        log.error(
            "creation journal %s: %s: creates an earlier process sent may be unknown, so "
            "IncreaseSize is refused for %gs (until they would have been listed)",
            self.journal.where if self.journal is not None else "",
            doubt,
            self.adopted_bound,
        )

    def expire_hold(self) -> None:
        """A hold is over once its end has passed and the inventory comes from a listing
        begun since (one begun before would not show the servers the held creates made);
        the journal's record then stops passing its doubt on. Every Refresh asks, so a
        record does not keep it for want of a scale-up."""
        if self._held is None or self._held[0] > min(self._clock(), self._applied_at):
            return
        self._held = None
        if self.journal is not None:
            self.journal.doubt = None
            self.journal.touch()

    def held(self) -> str | None:
        """Why scale-ups are held now (a journal that could not be read), or None."""
        if self._held is None:
            return None
        until, doubt = self._held
        remaining = until - self._clock()
        why = f"the creation journal could not be read whole ({doubt})"
        if remaining > 0:
            return (
                f"{why}: creates an earlier process sent may still be carried out; no "
                f"scale-up for {remaining:.0f}s more"
            )
        if self._applied_at < until:
            # The servers those creates made exist by now, but the inventory comes from a
            # listing begun before: it would not count them.
            return f"{why}: no scale-up until a listing begun since then (the next Refresh)"
        self.expire_hold()
        return None

    @property
    def adopted_bound(self) -> float:
        """How long a create of unknown outcome is counted (see ADOPTED_BOUND_FACTOR)."""
        return ADOPTED_BOUND_FACTOR * self._config.cloudscale.timeout_seconds

    def use_journal(self, store: JournalStore, holder: str) -> None:
        """Record creates in `store` from now on; before the first listing."""
        self.journal = Journal(
            store, self._config.cluster, holder, self.unconfirmed_entries, fence=self._fence
        )

    def unconfirmed_entries(self) -> list[Entry]:
        """What the journal must hold: every create the API has not answered yet (of removed
        groups too), and the entries of groups not configured here until their bound."""
        now = self._clock()
        return [entry for group in self._all_groups() for entry in group.journal_entries()] + [
            entry for entry, expires in self._foreign.values() if now < expires
        ]

    def journal_changed(self) -> None:
        if self.journal is not None:
            self.journal.touch()

    async def ensure_loaded(self, why: str) -> None:
        if not self.loaded:
            await self.sync(why)

    def _apply_listing(self, servers: Iterable[Server], start: int) -> bool:
        """Apply a listing begun at `start`; False when a newer one was applied already."""
        if start < self._applied_start:
            log.debug("dropping a listing older than the inventory (tick %d)", start)
            return False
        self._applied_start = start
        self._stale = False
        buckets: dict[str, dict[str, Server]] = {name: {} for name in self.groups}
        others: dict[str, dict[str, Server]] = {}  # of groups not configured
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
                bucket = others.setdefault(group_name, {})
            bucket[server.uuid] = server
        self.unconfigured = {name: len(servers) for name, servers in others.items()}
        for name, group in self.groups.items():
            group.apply_listing(buckets[name], start)
            self._check_overshoot(group)
        for name, group in list(self.retired.items()):
            group.apply_listing(others.get(name, {}), start)
            if not any(True for _ in group.pending_creations()) and not group.deleting:
                del self.retired[name]  # nothing of it in flight any more: the listing tells
                self._list_server_groups_next = self._tidy  # its server groups: orphans
        self._rebuild_index()
        self.journal_changed()  # creates it showed are confirmed
        return True

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

    def reconfigure(self, config: Config) -> list[GroupState]:
        """Take a reloaded config (same cluster): groups added, changed, removed (retired:
        kept while anything of theirs is in flight, revived if a later reload adds them
        again); the groups it removed. No await: atomic between calls."""
        old = self.groups
        revived = {
            name: self.retired.pop(name) for name in self._names(config) & self.retired.keys()
        }
        changed = [(old.get(gc.name) or revived.get(gc.name), gc) for gc in config.node_groups]
        self._config = config
        self.groups = {}
        for group, group_config in changed:
            if group is None:
                group = GroupState(group_config)
            else:
                group.reconfigure(group_config)
            self.groups[group.name] = group
        removed = [group for name, group in old.items() if name not in self.groups]
        for group in removed:
            self.retired[group.name] = group
            self.unconfigured[group.name] = len(group.servers)  # reported at once, kept
        for name in self.groups:
            self.unconfigured.pop(name, None)
        # Managed server groups may have changed hands (a group removed, antiAffinity off).
        self._list_server_groups_next = self._tidy
        self._ignored_groups -= self.groups.keys()  # a group back again is no longer ignored
        self._adopt_foreign(old.keys())
        self._rebuild_index()
        return removed

    @staticmethod
    def _names(config: Config) -> set[str]:
        return {group.name for group in config.node_groups}

    def serves(self, group: GroupState) -> bool:
        """Whether `group` is configured (not removed by a reload meanwhile)."""
        return self.groups.get(group.name) is group

    def removed_groups(self) -> dict[str, RemovedGroup]:
        """What is left of the groups not configured, by name: listed servers, creates in
        flight, managed server groups."""
        names = self.unconfigured.keys() | self.retired.keys() | self.server_groups.orphans.keys()
        report = {
            name: RemovedGroup(
                self.unconfigured.get(name, 0) + self._retired_pending(name, acked=True),
                self._retired_pending(name, acked=False),
                self._server_groups_of(name),
            )
            for name in sorted(names - self.groups.keys())
        }
        return {name: removed for name, removed in report.items() if not removed.empty}

    def _retired_pending(self, name: str, *, acked: bool) -> int:
        """A removed group's creates not listed yet: made (acknowledged) or not yet known."""
        group = self.retired.get(name)
        pending = () if group is None else group.pending_creations()
        return sum(1 for c in pending if (c.uuid is not None) == acked)

    def _server_groups_of(self, name: str) -> int:
        group = self.retired.get(name)
        placement = group.placement if group is not None else None
        if placement is not None:
            return placement.count
        return self.server_groups.orphaned_server_groups(name)

    def _adopt_foreign(self, before: Iterable[str]) -> None:
        """Count the kept journal entries of the groups a reload added, within their bound."""
        added = self.groups.keys() - set(before)
        now = self._clock()
        for request, (entry, expires) in list(self._foreign.items()):
            if now >= expires:
                del self._foreign[request]
            elif entry.group in added:
                del self._foreign[request]
                self.groups[entry.group].adopt(entry, expires)
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
        expired = group.expire_unconfirmed(now)
        for creation in expired:
            self._unconfirmed(group, creation, now)
        if expired:
            self.journal_changed()
        group.expire_placeholders(now, self._config.placeholder_expiry_seconds)

    def expire_retired(self) -> None:
        """Creates of unknown outcome of removed groups, past their bound: forgotten (no
        placeholder: nobody serves the group)."""
        now = self._clock()
        for group in self.retired.values():
            for creation in group.expire_unconfirmed(now):
                log.warning(
                    "node group %s (removed): create %s (%s) was not listed within %gs: taken "
                    "for never made",
                    group.name,
                    creation.request_id,
                    creation.name,
                    self.adopted_bound,
                )
                self.journal_changed()

    def _unconfirmed(self, group: GroupState, creation: Creation, now: float) -> None:
        """A create of unknown outcome no listing showed in time: its process died before
        sending it, or the API refused it. A failed placeholder, so CA deletes it and plans
        again."""
        message = (
            f"create {creation.request_id} ({creation.name}), recorded {creation.recorded_at}, "
            f"was not listed within {self.adopted_bound:g}s of its outcome being unknown: "
            "taken for never made"
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
