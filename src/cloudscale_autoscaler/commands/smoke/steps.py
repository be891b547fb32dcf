"""The smoke test's steps against the API, and the cleanup that undoes them.

Each step is the product's own code where the provider has it: the inventory's listing and
NodeGroupForNode (engine/inventory.py), NodeGroupNodes, DeleteNodes' ownership rule
(engine/group.py), the managed server groups' tags (engine/placement.py), the template's labels
(template/labels.py). What this run made is kept in `Made`, so the cleanup deletes exactly
that: the server found by its request tag (also when the create's answer was lost) and the
server group.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import TAG_REQUEST, Flavor, Server, ServerSpec
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.commands.smoke.plan import (
    TAG_SMOKE,
    Plan,
    StepFailed,
    Timeline,
    cost_text,
)
from cloudscale_autoscaler.engine import names
from cloudscale_autoscaler.engine.background import Background
from cloudscale_autoscaler.engine.errors import EngineError
from cloudscale_autoscaler.engine.group import DeleteServer, NodeRef
from cloudscale_autoscaler.engine.inventory import Inventory
from cloudscale_autoscaler.engine.placement import managed_by
from cloudscale_autoscaler.engine.providerid import format_provider_id
from cloudscale_autoscaler.journal.writer import unfenced
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.settings.types import Config, NodeGroupConfig
from cloudscale_autoscaler.template.labels import (
    LABEL_INSTANCE_TYPE,
    LABEL_REGION,
    LABEL_ZONE,
    label_sources,
    region_of,
)

T = TypeVar("T")

POLL_SECONDS = 2.0
# Cleanup gets at least this long, even when the step timeout is shorter.
CLEANUP_SECONDS = 120.0


@dataclasses.dataclass
class Made:
    """What this run created, or may have: cleanup deletes exactly this."""

    request_id: str
    server_group_name: str | None = None
    server_group: str | None = None
    create: asyncio.Future[Server] | None = None
    created_at: float | None = None
    gone_at: float | None = None


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Smoke:
    def __init__(
        self, config: Config, group: NodeGroupConfig, cloud: Cloud, wait_seconds: float
    ) -> None:
        self.config = config
        self.group = group
        self.cloud = cloud
        self.timeout = wait_seconds
        self.timeline = Timeline()
        self.made = Made(request_id=names.request_id())
        self.stamp = _utc_now()

    async def leftovers(self) -> list[Server]:
        """Servers an earlier smoke run of this cluster left behind (the smoke tag)."""
        servers = await self.cloud.list_servers(self.config.cluster)
        return [server for server in servers if TAG_SMOKE in server.tags]

    async def left_groups(self) -> list[str]:
        groups = await self.cloud.list_server_groups(self.config.cluster)
        return [group.uuid for group in groups if TAG_SMOKE in group.tags]

    # --- the steps ------------------------------------------------------------------------------

    async def run(self, plan: Plan) -> None:
        await self._clear_leftovers()
        request = plan.spec
        if plan.server_group_name is not None:
            request = await self._make_server_group(plan)
        server = await self._create(request)
        server = await self._wait_running(server)
        await self._check_counted(server)
        await self._check_deletable(server)
        await self._delete(server)
        await self._delete_server_group()
        await self._check_nothing_left()

    async def _step(self, step: str, action: Awaitable[T]) -> T:
        """Run one step's API calls: a CloudError fails the step, naming it."""
        try:
            return await action
        except CloudError as error:
            raise StepFailed(step, str(error)) from error

    async def _clear_leftovers(self) -> None:
        left = await self._step("leftovers", self.leftovers())
        groups = await self._step("leftovers", self.left_groups())
        if not left and not groups:
            self.timeline.say("leftovers", "none from earlier smoke runs")
            return
        shown = ", ".join(f"server {s.name} ({s.uuid})" for s in left)
        self.timeline.say(
            "leftovers",
            f"deleting what earlier runs left: {shown or ''} {len(groups)} server group(s)".strip(),
        )
        for server in left:
            await self._step("leftovers", self.cloud.delete_server(server.uuid))
        await self._step("leftovers", self._wait_gone({s.uuid for s in left}))
        for uuid in groups:
            await self._step("leftovers", self.cloud.delete_server_group(uuid))

    async def _make_server_group(self, plan: Plan) -> ServerSpec:
        name = self.made.server_group_name = plan.server_group_name
        assert name is not None
        zone = self.group.zone or ""
        made = await self._step(
            "server group", self.cloud.create_server_group(name, zone, plan.server_group_tags)
        )
        self.made.server_group = made.uuid
        self.timeline.say("server group", f"created {made.name} ({made.uuid}) in zone {made.zone}")
        return dataclasses.replace(plan.spec, server_groups=(made.uuid,))

    async def _create(self, request: ServerSpec) -> Server:
        # A task of its own: an interrupted run waits for its answer before cleaning up, so
        # a create already sent is not left to land after the cleanup looked.
        self.made.create = asyncio.ensure_future(self.cloud.create_server(request))
        server = await self._step("create", asyncio.shield(self.made.create))
        self.made.created_at = time.monotonic()
        self.timeline.say("create", f"server {server.name} ({server.uuid}), status {server.status}")
        return server

    async def _wait_running(self, server: Server) -> Server:
        deadline = time.monotonic() + self.timeout
        while True:
            listed = {s.uuid: s for s in await self._step("running", self._list())}
            found = listed.get(server.uuid)
            if found is None:
                raise StepFailed("running", f"server {server.uuid} is not listed any more")
            if found.status == "running":
                self.timeline.say("running", f"server {found.name} is running")
                return found
            if found.status == "error" or time.monotonic() >= deadline:
                why = (
                    "error"
                    if found.status == "error"
                    else f"{found.status} after {self.timeout:g}s"
                )
                raise StepFailed("running", f"server {found.name} is {why}, not running")
            await asyncio.sleep(POLL_SECONDS)

    async def _list(self) -> list[Server]:
        return await self.cloud.list_servers(self.config.cluster)

    async def _check_counted(self, server: Server) -> None:
        """As the provider counts: its listing and NodeGroupForNode (engine/inventory.py),
        NodeGroupNodes, and the server's flavor and zone against the template's labels."""
        inventory = _inventory(self.config, self.cloud)
        try:
            await inventory.sync("smoke")
        except EngineError as error:
            raise StepFailed("counted", str(error)) from error
        provider_id = format_provider_id(server.uuid)
        owner = inventory.node_group_for_node(provider_id).nodeGroup.id
        if owner != self.group.name:
            raise StepFailed(
                "counted",
                f"NodeGroupForNode({provider_id}) answers "
                f"{owner or 'no node group'!r}, not {self.group.name!r}",
            )
        states = {i.id: i.status.instanceState for i in inventory.nodes(self.group.name).instances}
        if states.get(provider_id) != pb.InstanceStatus.instanceRunning:
            raise StepFailed("counted", f"NodeGroupNodes does not list {provider_id} as running")
        self._check_labels(server)
        await self._check_server_group(server)
        target = inventory.target_size(self.group.name)
        self.timeline.say(
            "counted",
            f"NodeGroupForNode({provider_id}) = {owner}, listed "
            f"running by NodeGroupNodes, target size {target}; "
            f"flavor {server.flavor_slug}, zone {server.zone_slug} as the template says",
        )

    def _check_labels(self, server: Server) -> None:
        """The labels the cloud controller manager will set from the server (instance type,
        zone, region) must be the template's."""
        group = self.group
        # Only the flavor's slug and the group's zone decide these labels.
        flavor = Flavor(group.flavor, group.flavor, 0, 0)
        ccm = label_sources(group, flavor, self.config.gpu_label).ccm
        actual = {
            LABEL_INSTANCE_TYPE: server.flavor_slug,
            LABEL_ZONE: server.zone_slug,
            LABEL_REGION: region_of(server.zone_slug),
        }
        wrong = [
            f"{k}: template {v!r}, server {actual[k]!r}" for k, v in ccm.items() if actual[k] != v
        ]
        if wrong:
            raise StepFailed(
                "counted", "the template's labels differ from the server: " + "; ".join(wrong)
            )

    async def _check_server_group(self, server: Server) -> None:
        """The server group the provider would find again as the group's (tags) and the
        server in it."""
        uuid = self.made.server_group
        if uuid is None:
            return
        listed = await self._step("counted", self.cloud.list_server_groups(self.config.cluster))
        found = next((g for g in listed if g.uuid == uuid), None)
        if found is None or not managed_by(self.config.cluster, self.group.name, found):
            raise StepFailed(
                "counted",
                f"server group {uuid} is not listed as one the "
                f"provider manages for node group {self.group.name}",
            )
        if server.uuid not in found.servers:
            raise StepFailed(
                "counted",
                f"server {server.uuid} is not a member of server group "
                f"{found.name}: {list(found.servers)}",
            )

    async def _check_deletable(self, server: Server) -> None:
        """DeleteNodes' ownership rule (engine/group.py), on a fresh listing."""
        inventory = _inventory(self.config, self.cloud)
        try:
            await inventory.sync("smoke")
            node = NodeRef(format_provider_id(server.uuid), server.name)
            verdict = inventory.group(self.group.name).resolve(node, inventory.owner_of)
        except EngineError as error:
            raise StepFailed("deletable", str(error)) from error
        if not isinstance(verdict, DeleteServer):
            raise StepFailed("deletable", f"DeleteNodes would not delete it: {verdict}")
        self.timeline.say(
            "deletable",
            f"DeleteNodes would delete {server.name}: a server of "
            f"node group {self.group.name} in cluster {self.config.cluster}",
        )

    async def _delete(self, server: Server) -> None:
        await self._step("delete", self.cloud.delete_server(server.uuid))
        await self._step("delete", self._wait_gone({server.uuid}))
        self.made.gone_at = time.monotonic()
        self.timeline.say("delete", f"server {server.name} is gone")

    async def _wait_gone(self, uuids: set[str]) -> None:
        deadline = time.monotonic() + self.timeout
        while uuids & {server.uuid for server in await self._list()}:
            if time.monotonic() >= deadline:
                raise CloudError(
                    f"still listed {self.timeout:g}s after its DELETE: {sorted(uuids)}"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def _delete_server_group(self) -> None:
        uuid = self.made.server_group
        if uuid is None:
            return
        await self._step("delete server group", self.cloud.delete_server_group(uuid))
        self.made.server_group = None
        self.timeline.say("delete server group", f"{self.made.server_group_name} ({uuid}) is gone")

    async def _check_nothing_left(self) -> None:
        left = await self._step("nothing left", self._ours())
        if left:
            raise StepFailed("nothing left", f"still listed: {', '.join(left)}")
        cost = cost_text(self.config, self.group, self._server_seconds())
        self.timeline.say(
            "nothing left", f"no server or server group of this run is listed; cost {cost}"
        )

    def _server_seconds(self) -> float:
        made = self.made
        if made.created_at is None:
            return 0.0
        return (made.gone_at or time.monotonic()) - made.created_at

    async def _ours(self) -> list[str]:
        """This run's server and server group as the API lists them now."""
        servers = [
            f"server {s.name} ({s.uuid})"
            for s in await self._list()
            if s.tags.get(TAG_REQUEST) == self.made.request_id
        ]
        groups = []
        if self.made.server_group_name is not None:
            groups = [
                f"server group {g.name} ({g.uuid})"
                for g in await self.cloud.list_server_groups(self.config.cluster)
                if TAG_SMOKE in g.tags and g.name == self.made.server_group_name
            ]
        return servers + groups

    # --- cleanup --------------------------------------------------------------------------------

    async def cleanup(self) -> list[str]:
        """Delete this run's server (by its request tag) and server group; what is still
        listed afterwards, if anything."""
        made = self.made
        if made.create is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(made.create), CLEANUP_SECONDS)
        deadline = time.monotonic() + max(self.timeout, CLEANUP_SECONDS)
        while True:
            try:
                await self._cleanup_once()
                return await self._ours()
            except CloudError as error:
                if time.monotonic() >= deadline:
                    return [f"cleanup failed: {error}", *await _quietly(self._ours)]
                self.timeline.say("cleanup", f"{error}; trying again")
                await asyncio.sleep(POLL_SECONDS)

    async def _cleanup_once(self) -> None:
        mine = [s for s in await self._list() if s.tags.get(TAG_REQUEST) == self.made.request_id]
        for server in mine:
            self.timeline.say("cleanup", f"deleting server {server.name} ({server.uuid})")
            await self.cloud.delete_server(server.uuid)
        await self._wait_gone({server.uuid for server in mine})
        if self.made.server_group is not None:
            uuid = self.made.server_group
            self.timeline.say("cleanup", f"deleting server group {self.made.server_group_name}")
            await self.cloud.delete_server_group(uuid)
            self.made.server_group = None


async def _quietly(listing: Callable[[], Awaitable[list[str]]]) -> list[str]:
    try:
        return await listing()
    except CloudError as error:
        return [f"(cannot list what is left: {error})"]


def _inventory(config: Config, cloud: Cloud) -> Inventory:
    """The provider's own inventory, reading only: without antiAffinity its listing never
    deletes the empty server groups a running provider may be about to fill."""
    groups = tuple(dataclasses.replace(g, anti_affinity=False) for g in config.node_groups)
    return Inventory(
        dataclasses.replace(config, node_groups=groups),
        cloud,
        Background(),
        time.time,
        unfenced,
        tidy=False,
    )
