"""The fault campaign: a Hypothesis state machine driving the REAL server over mTLS gRPC, the
way the Cluster Autoscaler does, against the emulator with faults switched on and off.

Rules: IncreaseSize, DeleteNodes (CA-style: registered nodes by providerID, failed
placeholders as fake nodes; and adversarial ones naming servers that are not the group's),
DecreaseTargetSize, Refresh, NodeGroupNodes, TargetSize, NodeGroupForNode, concurrent bursts,
fault sets, manual cloud changes, provider restarts and settle points. After every step
`checks.check_step` runs; at settle points and at the end `checks.check_converged`.

Each rule's own expectations (exact target arithmetic) apply only when nothing else runs and
the engine already holds an inventory; bursts check status codes and the invariants only.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
import httpx
from fixtures.stack import Stack, group
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from campaign import checks
from campaign.checks import Ledger, instances, is_placeholder, target, uuid_of
from campaign.faults import fault_sets
from campaign.world import Outcome, World, call
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

T = TypeVar("T")
Code = grpc.StatusCode

CLUSTER = "camp"
RIVAL = "rival"
GROUPS = (
    group("workers", 0, 6, zone="lpg1"),
    group("batch", 1, 4, zone="rma1"),
)
GROUP_NAMES = tuple(g.name for g in GROUPS)
ZONE = {g.name: g.zone for g in GROUPS}
CONFIG_FIELDS: dict[str, Any] = {
    "cluster": CLUSTER,
    # Small, so creations queue and DecreaseTargetSize can cancel unsent ones. A short client
    # timeout (the faults' latencies stay under 0.3 s): a restarted provider counts a create
    # its predecessor journalled but may not have sent for 2 x timeoutSeconds, which
    # check_converged waits out.
    "cloudscale": {"max_concurrent_creates": 2, "timeout_seconds": 5.0},
}

group_names = st.sampled_from(GROUP_NAMES)
_names = itertools.count(1)


def pick(data: st.DataObject, items: list[T], most: int, least: int = 0) -> list[T]:
    """Draw up to `most` distinct items (at least `least` if there are any).

    The draw never depends on how many items there are: what exists at a step depends on
    timing (creations in flight), and Hypothesis requires each choice to be made from the
    same distribution when it replays a prefix. Indices are reduced modulo the length."""
    raw = data.draw(st.lists(st.integers(0, 255), min_size=least, max_size=most))
    chosen: list[int] = []
    for index in raw:
        if items and index % len(items) not in chosen:
            chosen.append(index % len(items))
    return [items[i] for i in chosen]


def fake_node(instance_id: str) -> pb.ExternalGrpcNode:
    """CA's node for an instance that never registered: providerID = name = instance id."""
    return pb.ExternalGrpcNode(providerID=instance_id, name=instance_id)


def registered_node(uuid: str, name: str) -> pb.ExternalGrpcNode:
    """CA's node for a registered server: the CCM's providerID, hostname = server name."""
    return pb.ExternalGrpcNode(
        providerID=f"cloudscale://{uuid}",
        name=name,
        labels={"kubernetes.io/hostname": name},
    )


def _progress() -> None:
    """With CAMPAIGN_PROGRESS=<file>, note every 50th example there (long runs)."""
    path = os.environ.get("CAMPAIGN_PROGRESS")
    if path and CampaignMachine.examples % 50 == 0:
        with open(path, "a") as out:
            out.write(
                f"{time.strftime('%H:%M:%S')} {CampaignMachine.examples} examples, "
                f"{CampaignMachine.steps} checked states\n"
            )


class CampaignMachine(RuleBasedStateMachine):
    # Examples started and steps checked in this process (reported by the test).
    examples = 0
    steps = 0

    def __init__(self, world: World) -> None:
        super().__init__()
        CampaignMachine.examples += 1
        _progress()
        self.world = world
        self.ledger = Ledger(CLUSTER, {g.name: g.max_size for g in GROUPS})
        self.failed = False
        self.stack: Stack = self._run(world.fresh_stack(GROUPS, **CONFIG_FIELDS))

    # --- plumbing ---------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self.world.run(coro)
        except BaseException:
            self.failed = True
            raise

    @property
    def engine(self) -> Any:
        return self.stack.provider.service.engine

    async def _servers(self) -> list[dict[str, Any]]:
        return await self.stack.admin.servers()

    async def _api_deletions(self) -> int:
        return sum(1 for d in await self.stack.admin.deletions() if d["by"] == "api")

    # --- CA's calls -----------------------------------------------------------------------------

    def _increase_call(self, name: str, delta: int) -> Awaitable[Outcome]:
        return call(
            "NodeGroupIncreaseSize",
            self.stack.stub.NodeGroupIncreaseSize,
            pb.NodeGroupIncreaseSizeRequest(id=name, delta=delta),
            [Code.FAILED_PRECONDITION, Code.UNAVAILABLE],
        )

    def _decrease_call(self, name: str, delta: int) -> Awaitable[Outcome]:
        return call(
            "NodeGroupDecreaseTargetSize",
            self.stack.stub.NodeGroupDecreaseTargetSize,
            pb.NodeGroupDecreaseTargetSizeRequest(id=name, delta=-delta),
            [Code.FAILED_PRECONDITION],
        )

    def _delete_call(self, name: str, nodes: list[pb.ExternalGrpcNode]) -> Awaitable[Outcome]:
        for node in nodes:
            uuid = node.providerID.removeprefix("cloudscale://")
            self.ledger.requested.add((name, uuid))
        return call(
            "NodeGroupDeleteNodes",
            self.stack.stub.NodeGroupDeleteNodes,
            pb.NodeGroupDeleteNodesRequest(id=name, nodes=nodes),
            [Code.FAILED_PRECONDITION, Code.UNAVAILABLE],
        )

    def _refresh_call(self) -> Awaitable[Outcome]:
        return call("Refresh", self.stack.stub.Refresh, pb.RefreshRequest(), [Code.UNAVAILABLE])

    async def _ca_nodes(self, name: str, chosen: list[pb.Instance]) -> list[pb.ExternalGrpcNode]:
        names = {s["uuid"]: s["name"] for s in await self._servers()}
        nodes = []
        for instance in chosen:
            uuid = uuid_of(instance)
            if is_placeholder(instance) or uuid not in names:
                nodes.append(fake_node(instance.id))  # never registered (or already gone)
            else:
                nodes.append(registered_node(uuid, names[uuid]))
        return nodes

    # --- rules: scaling -------------------------------------------------------------------------

    @rule(name=group_names, delta=st.integers(1, 3))
    def increase(self, name: str, delta: int) -> None:
        self._run(self._increase(name, delta))

    async def _increase(self, name: str, delta: int) -> None:
        loaded = self.engine.loaded
        before = await target(self.stack, name)
        outcome = await self._increase_call(name, delta)
        after = await target(self.stack, name)
        if not loaded:
            return  # the call loaded the inventory first: `before` was not the baseline
        if outcome.ok:
            assert after == before + delta, f"IncreaseSize({name}, {delta}): {before} -> {after}"
            return
        assert after == before, (
            f"IncreaseSize({name}, {delta}) failed ({outcome.code.name}: {outcome.details}) "
            f"but the target moved {before} -> {after}: not rolled back"
        )
        if outcome.code == Code.FAILED_PRECONDITION and "rolled back" not in outcome.details:
            # Not a permanent refusal of every create (fail_next_creates "invalid"): maxSize.
            assert before + delta > self.ledger.groups[name], outcome.details

    @rule(name=group_names, delta=st.integers(1, 3))
    def decrease(self, name: str, delta: int) -> None:
        self._run(self._decrease(name, delta))

    async def _decrease(self, name: str, delta: int) -> None:
        before = await target(self.stack, name)
        outcome = await self._decrease_call(name, delta)
        after = await target(self.stack, name)
        expected = before - delta if outcome.ok else before
        assert after == expected, (
            f"DecreaseTargetSize({name}, -{delta}) {outcome.code.name}: {before} -> {after}"
        )

    @rule(name=group_names, data=st.data())
    def delete_nodes(self, name: str, data: st.DataObject) -> None:
        listed = self._run(instances(self.stack, name))
        chosen = pick(data, listed, 3)
        if chosen:
            self._run(self._delete_ca_style(name, chosen))

    async def _delete_ca_style(self, name: str, chosen: list[pb.Instance]) -> None:
        nodes = await self._ca_nodes(name, chosen)
        outcome = await self._delete_call(name, nodes)
        if outcome.code == Code.FAILED_PRECONDITION:
            # The only refusal a CA-style request may get: it would go below minSize.
            assert "minSize" in outcome.details, outcome.details
        if not outcome.ok:
            return
        now = {i.id: i for i in await instances(self.stack, name)}
        for instance in chosen:
            still = now.get(instance.id)
            assert still is None or (
                not is_placeholder(still) and still.status.instanceState == checks.DELETING
            ), f"DeleteNodes({name}) succeeded but {instance.id} is still listed as {still}"

    @rule(name=group_names, data=st.data())
    def delete_foreign(self, name: str, data: st.DataObject) -> None:
        """A DeleteNodes naming one server that is not this group's (another group's, another
        cluster's, untagged): refused as a whole, nothing deleted."""
        servers = self._run(self._servers())
        foreign = [
            s
            for s in servers
            if (s.get("tags") or {}).get(TAG_GROUP) != name
            or ((s.get("tags") or {}).get(TAG_CLUSTER) != CLUSTER)
        ]
        strangers = pick(data, foreign, 1, 1)
        own = pick(data, self._run(instances(self.stack, name)), 2)
        for stranger in strangers:
            self._run(self._delete_foreign(name, stranger, own))

    async def _delete_foreign(
        self, name: str, stranger: dict[str, Any], own: list[pb.Instance]
    ) -> None:
        deleted_before = await self._api_deletions()
        nodes = [*await self._ca_nodes(name, own), registered_node(stranger["uuid"], "stranger")]
        outcome = await self._delete_call(name, nodes)
        # Refused as a whole (UNAVAILABLE: the re-listing before any deletion failed).
        assert outcome.code in (Code.FAILED_PRECONDITION, Code.UNAVAILABLE), (
            f"DeleteNodes({name}) with foreign server {stranger['uuid']} "
            f"(tags {stranger.get('tags')}) answered {outcome.code.name}"
        )
        assert await self._api_deletions() == deleted_before, "a refused DeleteNodes deleted"

    # --- rules: reads ---------------------------------------------------------------------------

    @rule()
    def refresh(self) -> None:
        self._run(self._refresh_call())

    @rule(name=group_names)
    def node_group_nodes(self, name: str) -> None:
        self._run(instances(self.stack, name))

    @rule(name=group_names)
    def target_size(self, name: str) -> None:
        self._run(target(self.stack, name))

    @rule(name=group_names)
    def node_group_for_node(self, name: str) -> None:
        """Every instance NodeGroupNodes shows belongs, by NodeGroupForNode, to its group."""
        self._run(self._for_node(name))

    async def _for_node(self, name: str) -> None:
        for instance in await instances(self.stack, name):
            request = pb.NodeGroupForNodeRequest(node=fake_node(instance.id))
            outcome = await call("NodeGroupForNode", self.stack.stub.NodeGroupForNode, request)
            owner = outcome.reply.nodeGroup.id
            assert owner == name, f"NodeGroupForNode({instance.id}) = {owner!r}, expected {name}"

    # --- rules: concurrency ---------------------------------------------------------------------

    @rule(data=st.data())
    def burst(self, data: st.DataObject) -> None:
        """Several CA calls at once (as CA's loop and a scale-down can overlap)."""
        kinds = ["increase", "decrease", "delete", "refresh", "nodes", "target"]
        plan = data.draw(st.lists(st.sampled_from(kinds), min_size=2, max_size=5))
        snapshot = {n: self._run(instances(self.stack, n)) for n in GROUP_NAMES}
        calls: list[Callable[[], Awaitable[Any]]] = []
        for kind in plan:
            name = data.draw(group_names)
            delta = data.draw(st.integers(1, 3))
            if kind == "increase":
                calls.append(lambda n=name, d=delta: self._increase_call(n, d))
            elif kind == "decrease":
                calls.append(lambda n=name, d=delta: self._decrease_call(n, d))
            elif kind == "delete":
                chosen = pick(data, snapshot[name], 2, 1)
                if chosen:
                    calls.append(lambda n=name, c=chosen: self._burst_delete(n, c))
            elif kind == "refresh":
                calls.append(self._refresh_call)
            elif kind == "nodes":
                calls.append(lambda n=name: instances(self.stack, n))
            else:
                calls.append(lambda n=name: target(self.stack, n))
        self._run(self._gather(calls))

    async def _burst_delete(self, name: str, chosen: list[pb.Instance]) -> Outcome:
        return await self._delete_call(name, await self._ca_nodes(name, chosen))

    @staticmethod
    async def _gather(calls: list[Callable[[], Awaitable[Any]]]) -> None:
        # Every call runs to its end even if one fails, so no RPC outlives the step.
        results = await asyncio.gather(*(c() for c in calls), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # --- rules: the world changes ---------------------------------------------------------------

    @initialize(faults=st.one_of(st.just({}), fault_sets))
    def start_with_faults(self, faults: dict[str, Any]) -> None:
        """Most examples begin with the cloud misbehaving (rule choice alone rarely picks it)."""
        if faults:
            self._run(self.stack.admin.set_faults(faults))

    @rule(faults=fault_sets)
    def set_faults(self, faults: dict[str, Any]) -> None:
        self._run(self.stack.admin.set_faults(faults))

    @rule()
    def clear_faults(self) -> None:
        self._run(self.stack.admin.clear_faults())

    @rule(data=st.data())
    def manual_delete_ours(self, data: st.DataObject) -> None:
        """Someone deletes one of our servers in the control panel."""
        servers = self._run(self._servers())
        ours = [s for s in servers if (s.get("tags") or {}).get(TAG_CLUSTER) == CLUSTER]
        for victim in pick(data, ours, 1, 1):
            self._run(self._admin_delete(victim["uuid"]))

    async def _admin_delete(self, uuid: str) -> None:
        try:
            await self.stack.admin.delete_server(uuid)
        except httpx.HTTPStatusError as error:
            # A slow deletion of ours may have run out since the listing.
            if error.response.status_code != 404:
                raise

    @rule(name=group_names)
    def manual_create_ours(self, name: str) -> None:
        """Someone creates a server with our tags (it joins the group at the next listing)."""
        self._run(self._manual_create_ours(name))

    async def _manual_create_ours(self, name: str) -> None:
        # Not limited by maxSize: no provider can stop someone else; the invariant allows
        # for these servers (checks.Ledger.manual).
        server = await self.stack.admin.create_server(
            f"{CLUSTER}-{name}-manual{next(_names)}",
            tags={TAG_CLUSTER: CLUSTER, TAG_GROUP: name},
            zone=ZONE[name],
        )
        self.ledger.manual.add(server["uuid"])

    @rule()
    def manual_create_untagged(self) -> None:
        self._run(self.stack.admin.create_server(f"pet-{next(_names)}", zone="lpg1"))

    @rule(name=group_names)
    def manual_create_rival(self, name: str) -> None:
        """A server of another cluster, with a group tag of the same name as ours."""
        self._run(
            self.stack.admin.create_server(
                f"{RIVAL}-{name}-{next(_names)}",
                tags={TAG_CLUSTER: RIVAL, TAG_GROUP: name},
                zone=ZONE[name],
            )
        )

    @rule()
    def restart(self) -> None:
        """A new provider process-equivalent: all state must come back from the cloud."""
        self.stack = self._run(self.world.restart())

    @rule()
    def settle(self) -> None:
        """Faults off, wait for the work in flight, Refresh: everything must add up."""
        self._run(checks.check_converged(self.stack, self.ledger))

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        CampaignMachine.steps += 1
        self._run(checks.check_step(self.stack, self.ledger))

    def teardown(self) -> None:
        if not self.failed:  # a failure already being reported must not be masked
            self._run(checks.check_converged(self.stack, self.ledger))
