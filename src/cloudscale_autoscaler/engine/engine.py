"""The engine: node groups over the cloud, as CA's externalgrpc calls need them.

Engine is the face the service layer calls; each RPC's logic lives in the module named for
what it changes:
- inventory.py: Refresh's listing, NodeGroupForNode, NodeGroupTargetSize, NodeGroupNodes;
- creations.py: NodeGroupIncreaseSize (batches, placeholders, verdicts) and
  NodeGroupDecreaseTargetSize;
- deletions.py: NodeGroupDeleteNodes, the tagged delete, deletions resumed on Refresh;
- background.py: the tasks that outlive their call, and shutdown.
Engine itself owns only the lifecycle (start, Refresh's order of steps, shutdown) and the
answers that come from config and the catalog (templates, GPU types, autoscaling options).
Imports run one way, engine.py → creations.py, deletions.py → inventory.py → background.py,
so state is passed down explicitly and never reached back for.

Runs on the asyncio loop only, no threads: state changes between two awaits are atomic, so
no locks are needed. Every check-then-act sequence keeps its check and its act in one
synchronous stretch inside one method; each module's docstring says what state it owns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from cloudscale_autoscaler.cloud.protocol import Cloud, Fence
from cloudscale_autoscaler.engine import options
from cloudscale_autoscaler.engine.background import Background
from cloudscale_autoscaler.engine.catalog import Catalog
from cloudscale_autoscaler.engine.creations import Creations
from cloudscale_autoscaler.engine.deletions import Deletions
from cloudscale_autoscaler.engine.errors import CloudUnavailable, Unimplemented
from cloudscale_autoscaler.engine.group import NodeRef
from cloudscale_autoscaler.engine.inventory import Inventory, api_problem
from cloudscale_autoscaler.engine.observer import Observer
from cloudscale_autoscaler.engine.pricing import Pricer
from cloudscale_autoscaler.engine.status import (
    GroupStatus,
    RefreshOutcome,
    RemovedGroup,
    group_status,
)
from cloudscale_autoscaler.journal.store import JournalStore
from cloudscale_autoscaler.journal.writer import unfenced
from cloudscale_autoscaler.observability.metrics import GroupStats
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.settings.types import Config

log = logging.getLogger(__name__)

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
        self._fence: Fence = unfenced
        self._background = Background()
        self._inventory = Inventory(config, cloud, self._background, clock, self.fenced)
        self._catalog = Catalog(config, cloud)
        # Failed creations and deletions as they happen, for whoever subscribes.
        self.observer = Observer()
        self._creations = Creations(
            config,
            cloud,
            self._inventory,
            self._background,
            self._catalog,
            self.observer,
            clock,
            self.fenced,
        )
        self._deletions = Deletions(cloud, self._inventory, self._background, self.observer)
        # None without `pricing`: the pricing RPCs then answer UNIMPLEMENTED.
        self.pricing = self._pricer(config)
        self._options: dict[tuple[str, bytes], pb.NodeGroupAutoscalingOptionsResponse] = {}
        # Unix time of the last successful Refresh, for the metrics endpoint; 0 = never.
        self.last_refresh_unix = 0.0
        # The last Refresh, successful or not, for the status view; None = none yet.
        self.last_refresh: RefreshOutcome | None = None
        self._clock = clock

    @property
    def cloud(self) -> Cloud:
        """The cloud the engine works on (the reload's online check asks it too)."""
        return self._cloud

    def _pricer(self, config: Config) -> Pricer | None:
        if config.pricing is None:
            return None
        return Pricer(config, config.pricing, self._catalog, self._inventory.group_name_of)

    def fenced(self) -> str | None:
        """None while this process may send creates (and write the creation journal), else
        why not: the fence `use_fence` set, asked right before each attempt to send."""
        return self._fence()

    def use_fence(self, fence: Fence) -> None:
        """Leader election: creates and journal writes only while `fence` allows them."""
        self._fence = fence

    def reconfigure(self, config: Config) -> list[str]:
        """Serve a reloaded config (validated, same cluster and process settings) from now on:
        the groups, their sizes, templates and create settings, prices, options, all in one
        synchronous stretch (templates are built again by `warm_templates`, or on demand).
        Returns the groups it removed; `stop_removed` then cancels their creates not yet
        sent (what they keep is reported by `removed_groups`: a reload never deletes a
        server)."""
        pricing = self._pricer(config)
        removed = self._inventory.reconfigure(config)
        self.config = config
        self._creations.reconfigure(config)
        self.pricing = pricing
        self._options.clear()
        self._catalog.reconfigure(config)
        return [group.name for group in removed]

    def stop_removed(self, names: list[str]) -> dict[str, RemovedGroup]:
        """Send nothing more for the groups a reload removed: cancel their creates not sent
        yet, drop their placeholders (the reload's last step, once it was applied whole).
        What each still has."""
        retired = self._inventory.retired
        groups = [retired[name] for name in names if name in retired]
        self._creations.retire(groups, "its node group was removed by a reload")
        report = self._inventory.removed_groups()
        return {name: report.get(name, RemovedGroup(0, 0, 0)) for name in names}

    async def warm_templates(self) -> None:
        """Build the templates of the running config from the flavors fetched already."""
        await self._catalog.warm()

    def removed_groups(self) -> dict[str, RemovedGroup]:
        """What is left of node groups no longer (or never) configured, by name: kept, not
        served, reported until gone."""
        return self._inventory.removed_groups()

    @property
    def on_change(self) -> Callable[[], None]:
        """Called when a background task (a creation, a deletion) finished and may have
        changed the state; changes made inside an RPC are published by the transport after
        the call."""
        return self._background.on_change

    @on_change.setter
    def on_change(self, hook: Callable[[], None]) -> None:
        self._background.on_change = hook

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

    def refuse_creations(self) -> None:
        """From now on IncreaseSize is refused: the process is stopping. Called the moment
        the signal arrives, before the server stops listening, since a call already taken
        in may run first."""
        self._background.closing = True

    async def aclose(self, grace_seconds: float = 10.0) -> None:
        """Stop: drop creations never sent, give requests already out `grace_seconds` to
        finish (their servers carry our tags, so a restart finds them either way)."""
        self._background.closing = True
        self.drop_queued_creations("shutting down")
        await self._background.drain(grace_seconds)
        if self._inventory.journal is not None:
            await self._inventory.journal.aclose()

    def drop_queued_creations(self, why: str) -> None:
        """Cancel creations not sent to the cloud yet (shutdown, or leadership lost: the
        next leader counts only servers that exist), saying per group how many."""
        self._creations.drop_queued(why)

    @property
    def has_journal(self) -> bool:
        return self._inventory.journal is not None

    def use_journal(self, store: JournalStore, holder: str) -> None:
        """Record creates in `store` before they are sent, and count what an earlier process
        left there (`holder` names this replica in it). Call before start or load: without a
        journal a restart during a scale-up can double it."""
        self._inventory.use_journal(store, holder)

    async def load(self, timeout_seconds: float = 10.0) -> None:
        """Load the inventory now; raises CloudUnavailable or TimeoutError."""
        # asyncio.timeout: 3.11's wait_for can swallow a cancel (leadership lost) that comes
        # as the listing ends, and the new leader's preparation would carry on.
        async with asyncio.timeout(timeout_seconds):
            await self.refresh()

    def forget_inventory(self) -> None:
        """Mark the inventory stale (a new leadership: another replica may have changed the
        cloud meanwhile); see Inventory.forget."""
        self._inventory.forget()

    @property
    def loaded(self) -> bool:
        return self._inventory.loaded

    # --- Refresh --------------------------------------------------------------------------

    async def refresh(self) -> None:
        at, started = time.time(), time.monotonic()
        try:
            await self._refresh()
        except asyncio.CancelledError:
            why = "abandoned: its caller gave up (a deadline, or shutdown)"
            self.last_refresh = RefreshOutcome(at, time.monotonic() - started, why)
            raise
        except Exception as error:
            why = str(error) or type(error).__name__
            self.last_refresh = RefreshOutcome(at, time.monotonic() - started, why)
            raise
        self.last_refresh = RefreshOutcome(at, time.monotonic() - started)
        self.last_refresh_unix = time.time()

    async def _refresh(self) -> None:
        await self._inventory.sync("Refresh")
        if not self._background.closing:
            self._deletions.resume()
        await self._catalog.refresh()
        for group in self._inventory.groups.values():
            self._inventory.expire(group)
        self._inventory.expire_retired()
        self._inventory.expire_hold()

    # --- reads ----------------------------------------------------------------------------

    def node_group_for_node(self, provider_id: str) -> pb.NodeGroupForNodeResponse:
        return self._inventory.node_group_for_node(provider_id)

    def provider_index(self) -> Mapping[str, pb.NodeGroupForNodeResponse]:
        return self._inventory.provider_index()

    def settled_targets(self) -> dict[str, int]:
        return self._inventory.settled_targets()

    def group_stats(self) -> list[GroupStats]:
        return self._inventory.group_stats()

    def group_statuses(self) -> list[GroupStatus]:
        """Each group's state for the status view (a pure read: nothing expires here)."""
        now, now_unix = self._clock(), time.time()
        lifetime = self.config.placeholder_expiry_seconds
        return [
            group_status(group, now, now_unix, lifetime)
            for group in self._inventory.groups.values()
        ]

    def target_size(self, name: str) -> int:
        return self._inventory.target_size(name)

    def nodes(self, name: str) -> pb.NodeGroupNodesResponse:
        return self._inventory.nodes(name)

    async def template_node_info(self, name: str) -> pb.NodeGroupTemplateNodeInfoResponse:
        return await self._catalog.template(self._inventory.group(name).config)

    def built_templates(self) -> Mapping[str, pb.NodeGroupTemplateNodeInfoResponse]:
        """The templates built, by group: each is what template_node_info answers. A new
        mapping whenever a Refresh drops them (the flavor list changed)."""
        return self._catalog.templates

    async def gpu_types(self) -> list[str]:
        return await self._catalog.gpu_types()

    def api_failure_since(self, since: float) -> str | None:
        """Why the API gave no answer yet, if an attempt failed after `since`
        (time.monotonic()) and its client is retrying: what a caller that cannot wait longer
        is told instead of "slow"."""
        error = self._cloud.failed_since(since)
        return None if error is None else f"{api_problem(error)}: {error}"

    def autoscaling_options(
        self, name: str, defaults: pb.NodeGroupAutoscalingOptions
    ) -> pb.NodeGroupAutoscalingOptionsResponse:
        group = self._inventory.group(name)
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

    # --- changes --------------------------------------------------------------------------

    async def increase_size(self, name: str, delta: int) -> None:
        await self._creations.increase_size(name, delta)

    def decrease_target_size(self, name: str, delta: int) -> None:
        self._creations.decrease_target_size(name, delta)

    async def delete_nodes(self, name: str, nodes: Sequence[NodeRef]) -> None:
        await self._deletions.delete_nodes(name, nodes)
