"""The seams campaign's state machine: CA's calls to whichever replica serves, interleaved with
what happens around a provider: config reloads (valid and invalid edits; groups removed, added,
renamed; maxSize, interfaces, zones and antiAffinity changed; one replica's file lagging the
other's), leadership lost and taken (a replica cut off from the Kubernetes API while alive, or
from the cloud), kills at any point (mid scale-up too) and restarts, journal records damaged,
foreign or deleted, and cloud faults (server-group refusals among them), with virtual time
passing between them. After every step: checks.check_step, and a Refresh of the replica
serving with checks.check_after_refresh; at the end, liveness and convergence.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from campaign.seams import checks
from campaign.seams.clock import STEP_LIMIT_SECONDS
from campaign.seams.replica import NAMESPACE
from campaign.seams.world import (
    CLUSTER,
    LEASE,
    REPLICAS,
    TIMEOUT_SECONDS,
    Schedule,
    base_document,
    group,
)
from cloudscale_autoscaler.cloud.emulator.faults import Faults, parse_faults
from cloudscale_autoscaler.journal.entries import Entry, decode, encode
from cloudscale_autoscaler.kube.journal import KEY
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

T = TypeVar("T")
JOURNAL = f"{LEASE}-journal"
# Once faults stop and the config is valid, a replica serves, and Refresh and IncreaseSize
# succeed, within this much virtual time: a Lease running out (15 s) after its holder was
# killed, three failed inventory loads of a leader that gives it up (3 x (10 s + 2 s)), a
# standby's turn (2 s), a load (10 s at most).
LIVENESS_SECONDS = 90.0
# Creates of unknown outcome are counted for 2 x timeoutSeconds; placeholders expire later.
SETTLE_SECONDS = 4 * TIMEOUT_SECONDS

# Which replica a seam hits: the one serving CA, or the other (a standby, or a dead one).
roles = st.sampled_from(["leader", "leader", "other"])
# Whether a kill lands in a scale-up CA just asked for (mostly: that is where it hurts).
mid = st.sampled_from([True, True, False])
which = st.sampled_from(["a", "b", "both"])
seconds = st.sampled_from([0.05, 0.5, 2.0, 5.0, 12.0, 30.0])
# How long CA's next call comes after the step before (its loop runs every 10 s).
pauses = st.sampled_from([0.0, 0.5, 2.0, 10.0])
indices = st.integers(0, 7)
FILL = 0  # a scale-up to maxSize
deltas = st.sampled_from([1, 2, 3, FILL, FILL])
# Pods waiting for a group's nodes: none, some, more than its maxSize.
demands = st.sampled_from([0, 1, 3, 6, 6])
# Where in a scale-up a kill lands: a few loop turns in (before its journal write, between
# its creates), or some virtual time in (creates out, held by the API).
turns = st.integers(0, 60)
delays = st.sampled_from([0.0, 0.0, 0.001, 0.05, 0.5, 2.0])
_names = itertools.count(1)

EDITS = (
    "max-up", "max-down", "remove-batch", "add-extra", "rename-workers", "anti-affinity",
    "private-network", "public-network", "pool-in-two-zones", "invalid-yaml",
    "invalid-value", "unknown-flavor", "back-to-base",
)  # fmt: skip
FAULTS: tuple[dict[str, Any], ...] = (
    {"latency": {"create_server": {"fixed_ms": 3000}}},
    {"latency": {"*": {"fixed_ms": 200, "jitter_ms": 200}}},
    {"error_rate": {"*": {"rate": 0.3, "status": 503}}},
    {"rate_limit": {"create_server": {"rate": 0.5, "retry_after": 1}}},
    {"quota": {"max_servers": 3}},
    {"fail_next_creates": {"count": 2, "kind": "capacity"}},
    {"zones_out_of_capacity": ["rma1"]},
    {"host_shortage": {"zones": ["rma1"], "count": 2}},
    {"lose_create_responses": {"count": 2, "mode": "drop"}},
    {"latency": {"create_server": {"fixed_ms": 8000}},
     "lose_create_responses": {"count": 1, "mode": "504"}},
    {"slow_deletes_seconds": 3.0},
    {"down": True},
)  # fmt: skip
SLOW_CREATES: tuple[dict[str, Any], ...] = tuple(
    {"latency": {"create_server": {"fixed_ms": ms}}} for ms in (2000, 4000, 8000, 8000)
)
DAMAGE = ("garbage", "deep", "foreign-cluster", "deleted", "stale-entry")


def edited(document: dict[str, Any], edit: str) -> dict[str, Any] | str:
    """`document` with one edit a platform engineer might make (or get wrong)."""
    doc = copy.deepcopy(document)
    groups: list[dict[str, Any]] = doc["nodeGroups"]
    first = groups[0]
    if edit == "max-up":
        first["maxSize"] = min(int(first["maxSize"]) + 2, 8)
    elif edit == "max-down":
        first["maxSize"] = max(int(first["maxSize"]) - 2, 0)
    elif edit == "remove-batch":
        doc["nodeGroups"] = [g for g in groups if g["name"] != "batch"] or groups[:1]
    elif edit == "add-extra" and all(g["name"] != "extra" for g in groups):
        groups.append(group("extra", 2))
    elif edit == "rename-workers":
        for g in groups:
            if g["name"] == "workers":
                g["name"] = "pool"
    elif edit == "anti-affinity":
        first["antiAffinity"] = not first.get("antiAffinity", False)
    elif edit == "private-network":
        first["interfaces"] = [{"network": "k8s-nodes"}]
    elif edit == "public-network":
        first.pop("interfaces", None)
    elif edit == "pool-in-two-zones":
        first.pop("zone", None)
        first["zones"] = ["lpg1", "rma1"]
    elif edit == "invalid-yaml":
        return "nodeGroups: [\n"
    elif edit == "invalid-value":
        first["maxSize"] = -1
    elif edit == "unknown-flavor":
        first["flavor"] = "flex-99-99"
    elif edit == "back-to-base":
        return base_document()
    return doc


class SeamsMachine(RuleBasedStateMachine):
    schedules = 0
    steps = 0
    calls = 0
    unrouted = 0

    def __init__(self, make: Any) -> None:
        super().__init__()
        SeamsMachine.schedules += 1
        self.schedule: Schedule = make()
        # Pods CA wants nodes for, by group (groups unnamed here: the default).
        self.demand: dict[str, int] = {}
        self.default_demand = 0
        self._run(self.schedule.start())

    def _run(self, coro: Coroutine[Any, Any, T], limit: float = STEP_LIMIT_SECONDS) -> T:
        return self.schedule.vloop.run(coro, limit)

    # --- CA -------------------------------------------------------------------------------

    def _groups(self) -> list[str]:
        leader = self.schedule.leader()
        return [] if leader is None else [g.name for g in leader.config.node_groups]

    def _group(self, index: int) -> str | None:
        groups = self._groups()
        return groups[index % len(groups)] if groups else None

    def _pause(self, pause: float) -> None:
        if pause:
            self._run(self.schedule.wait(pause))

    @rule(pause=pauses)
    def refresh(self, pause: float) -> None:
        self._pause(pause)
        self._run(self.schedule.ca("Refresh", pb.RefreshRequest(), ("UNAVAILABLE",)))

    @rule(index=indices, delta=deltas, pause=pauses)
    def scale_up(self, index: int, delta: int, pause: float) -> None:
        self._pause(pause)
        name = self._group(index)
        if name is not None:
            self._run(self._scale_up(name, delta))

    async def _scale_up(self, name: str, delta: int) -> None:
        """As CA does: within maxSize by the target it reads (FILL: up to maxSize, as for
        enough pending pods)."""
        codes = ("UNAVAILABLE", "NOT_FOUND", "FAILED_PRECONDITION")
        size = await self.schedule.ca(
            "NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=name), codes
        )
        leader = self.schedule.leader()
        if size is None or not size.ok or leader is None:
            return
        config = leader.config.group(name)
        if config is None:
            return
        if delta == FILL:
            delta = config.max_size - size.reply.targetSize
        if delta <= 0 or size.reply.targetSize + delta > config.max_size:
            return
        request = pb.NodeGroupIncreaseSizeRequest(id=name, delta=delta)
        await self.schedule.ca("NodeGroupIncreaseSize", request, codes)

    @rule(index=indices, count=st.integers(1, 3), failed_only=st.booleans(), pause=pauses)
    def scale_down(self, index: int, count: int, failed_only: bool, pause: float) -> None:
        """CA deletes failed instances (placeholders), and unneeded nodes."""
        self._pause(pause)
        name = self._group(index)
        if name is not None:
            self._run(self._scale_down(name, count, failed_only))

    async def _scale_down(self, name: str, count: int, failed_only: bool) -> None:
        codes = ("UNAVAILABLE", "NOT_FOUND", "FAILED_PRECONDITION")
        nodes = await self.schedule.ca("NodeGroupNodes", pb.NodeGroupNodesRequest(id=name), codes)
        if nodes is None or not nodes.ok:
            return
        chosen = [
            i
            for i in nodes.reply.instances
            if i.id.startswith(checks.PLACEHOLDER) == failed_only
            and i.status.instanceState != pb.InstanceStatus.instanceDeleting
        ][:count]
        if not chosen:
            return
        for instance in chosen:
            self.schedule.requested.add((name, instance.id.removeprefix("cloudscale://")))
        request = pb.NodeGroupDeleteNodesRequest(
            id=name, nodes=[pb.ExternalGrpcNode(providerID=i.id, name=i.id) for i in chosen]
        )
        await self.schedule.ca("NodeGroupDeleteNodes", request, codes)

    @rule(index=indices, count=st.integers(1, 2))
    def decrease(self, index: int, count: int) -> None:
        name = self._group(index)
        if name is not None:
            request = pb.NodeGroupDecreaseTargetSizeRequest(id=name, delta=-count)
            codes = ("FAILED_PRECONDITION", "NOT_FOUND", "UNAVAILABLE")
            self._run(self.schedule.ca("NodeGroupDecreaseTargetSize", request, codes))

    @rule(duration=seconds)
    def wait(self, duration: float) -> None:
        self._run(self.schedule.wait(duration))

    # --- the world around the provider -----------------------------------------------------

    @initialize(faults=st.sampled_from(SLOW_CREATES + FAULTS), demand=demands)
    def start_with_faults(self, faults: dict[str, Any], demand: int) -> None:
        """Most schedules begin with creates the API takes a while to carry out, so kills,
        failovers and reloads find creates in flight, and with pods waiting for nodes."""
        self.schedule.emulator.state.set_faults(parse_faults(faults, ("lpg1", "rma1")))
        self.default_demand = demand

    @rule(index=indices, demand=demands)
    def pods(self, index: int, demand: int) -> None:
        """The pods waiting for a group's nodes change (CA's loop acts on them)."""
        name = self._group(index)
        if name is not None:
            self.demand[name] = demand

    @rule(faults=st.sampled_from(FAULTS))
    def cloud_faults(self, faults: dict[str, Any]) -> None:
        self.schedule.emulator.state.set_faults(parse_faults(faults, ("lpg1", "rma1")))

    @rule()
    def cloud_heals(self) -> None:
        self.schedule.emulator.state.set_faults(Faults())

    def _named(self, role: str) -> str:
        leader = self.schedule.leader()
        first = leader.name if leader is not None else REPLICAS[0]
        return first if role == "leader" else next(n for n in REPLICAS if n != first)

    @rule(role=roles, mid_scale_up=mid, iterations=turns, delay=delays)
    def kill(self, role: str, mid_scale_up: bool, iterations: int, delay: float) -> None:
        """SIGKILL, at once or `iterations` loop turns and `delay` virtual seconds into a
        scale-up CA just asked for."""
        self._run(self._kill(self._named(role), mid_scale_up, iterations, delay))

    async def _kill(self, name: str, mid_scale_up: bool, iterations: int, delay: float) -> None:
        replica = self.schedule.replicas.get(name)
        if replica is None or replica.dead:
            return
        call = None
        target = self._group(0)
        if mid_scale_up and replica.serving and target is not None:
            call = asyncio.ensure_future(self._scale_up(target, FILL))
        for _ in range(iterations):
            await asyncio.sleep(0)
        if delay:
            await asyncio.sleep(delay)
        await replica.kill(self.schedule.vloop)
        if call is not None:
            await asyncio.gather(call, return_exceptions=True)

    @rule(role=roles, mid_scale_up=mid, iterations=turns, delay=delays)
    def crash_and_restart(
        self, role: str, mid_scale_up: bool, iterations: int, delay: float
    ) -> None:
        """A container restart: killed, and its successor (the same Pod name, so the same
        Lease holder) started at once."""
        name = self._named(role)
        self._run(self._kill(name, mid_scale_up, iterations, delay))
        self._run(self.schedule.spawn(name))

    @rule(role=roles)
    def stop(self, role: str) -> None:
        replica = self.schedule.replicas.get(self._named(role))
        if replica is not None:
            self._run(replica.stop())

    @rule(role=roles)
    def start(self, role: str) -> None:
        self._run(self.schedule.spawn(self._named(role)))

    @rule(role=roles, cut=st.booleans())
    def kube_link(self, role: str, cut: bool) -> None:
        """Cut off from the Kubernetes API while alive (its Lease lapses, another takes it),
        or reconnected."""
        replica = self.schedule.replicas.get(self._named(role))
        if replica is not None and not replica.dead:
            replica.view.cut = cut

    @rule(role=roles, cut=st.booleans())
    def cloud_link(self, role: str, cut: bool) -> None:
        name = self._named(role)
        replica = self.schedule.replicas.get(name)
        if replica is not None and not replica.dead:
            relay = self.schedule.relays[name]
            relay.sever() if cut else relay.mend()

    @rule(edit=st.sampled_from(EDITS), to=which, lag=st.booleans())
    def reload(self, edit: str, to: str, lag: bool) -> None:
        """Edit the config (both files, or one: the other's mount lags) and reload it."""
        self._run(self._reload(edit, to, lag))

    async def _reload(self, edit: str, to: str, lag: bool) -> None:
        names = list(REPLICAS) if to == "both" else [to]
        base = self.schedule.documents[names[0]]
        document = edited(base, edit)
        for name in names:
            self.schedule.write(name, document)
        for name in names[: 1 if lag else None]:
            replica = self.schedule.replicas.get(name)
            if replica is not None and not replica.dead:
                await replica.reload()

    @rule(damage=st.sampled_from(DAMAGE))
    def damage_journal(self, damage: str) -> None:
        """The journal's ConfigMap edited by hand, overwritten or deleted."""
        double = self.schedule.double
        if damage == "deleted":
            double.delete("ConfigMap", NAMESPACE, JOURNAL)
            return
        if damage == "stale-entry":  # an earlier holder's create that never happened
            # Added to the record as it is: one edited into a whole record that lacks the
            # creates in flight cannot be told from a true one, by any reader (the entries
            # are the record); that is not a fault the journal can answer.
            stored = double.get("ConfigMap", NAMESPACE, JOURNAL)
            record = decode(((stored or {}).get("data") or {}).get(KEY) or "", CLUSTER)
            if record.problems or not record.holder:
                return
            entry = Entry(f"stale{next(_names):08d}", "workers", "seams-workers-stale", "then")
            text = encode(CLUSTER, record.holder, [*record.entries, entry], record.doubt)
        else:
            text = {
                "garbage": "}{ not json",
                "deep": "[" * 50_000,
                "foreign-cluster": encode("elsewhere", "x", []),
            }[damage]
        body = {"metadata": {"name": JOURNAL}, "data": {KEY: text}}
        if double.get("ConfigMap", NAMESPACE, JOURNAL) is None:
            double.create("ConfigMap", NAMESPACE, body)
        else:
            double.patch("ConfigMap", NAMESPACE, JOURNAL, {"data": {KEY: text}})

    # --- invariants and the end -------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        """The checks, and CA's loop (it runs all the time, whatever else happens): its
        Refresh is the one checks.check_after_refresh reads after."""
        SeamsMachine.steps += 1
        checks.check_step(self.schedule)
        self._run(self._ca_loop())
        checks.check_step(self.schedule)

    async def _ca_loop(self) -> None:
        """One loop of CA: Refresh (then the checks of what it serves); per group, delete the
        failed instances and ask for the nodes its pending pods need, within maxSize by the
        target it reads."""
        if not await checks.check_after_refresh(self.schedule):
            return
        leader = self.schedule.leader()
        if leader is None:
            return
        for config in leader.config.node_groups:
            await self._scale_down(config.name, 8, failed_only=True)
            wanted = min(self.demand.get(config.name, self.default_demand), config.max_size)
            size = await self.schedule.ca(
                "NodeGroupTargetSize",
                pb.NodeGroupTargetSizeRequest(id=config.name),
                ("UNAVAILABLE", "NOT_FOUND"),
            )
            if size is not None and size.ok and size.reply.targetSize < wanted:
                await self._scale_up(config.name, wanted - size.reply.targetSize)

    def teardown(self) -> None:
        try:
            self._run(self._live_and_settled(), limit=300.0)
        finally:
            SeamsMachine.calls += self.schedule.answers
            SeamsMachine.unrouted += self.schedule.unrouted
            self._run(self.schedule.close())

    async def _live_and_settled(self) -> None:
        """Faults off, links up, a valid config everywhere, both replicas running: within
        LIVENESS_SECONDS a replica serves and Refresh and IncreaseSize succeed; then, once
        the creates in flight are over, every invariant holds."""
        schedule = self.schedule
        schedule.emulator.state.set_faults(Faults())
        for name in REPLICAS:
            schedule.relays[name].mend()
            replica = schedule.replicas.get(name)
            if replica is not None:
                replica.view.cut = False
            schedule.write(name, base_document())
            if replica is not None and not replica.dead:
                await replica.reload()
            assert await schedule.spawn(name), f"replica {name} cannot start on its config"
        await self._liveness()
        await schedule.wait(SETTLE_SECONDS)
        checks.check_step(schedule)
        await checks.check_after_refresh(schedule)

    async def _liveness(self) -> None:
        schedule = self.schedule
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LIVENESS_SECONDS
        while True:
            leader = schedule.leader()
            if leader is not None:
                refreshed = await leader.call("Refresh", pb.RefreshRequest(), 5.0)
                if refreshed.ok and await self._can_scale_up(leader):
                    return
            assert loop.time() < deadline, (
                f"no replica serves Refresh and IncreaseSize {LIVENESS_SECONDS:g}s after the "
                f"faults stopped: serving {[r.name for r in schedule.leaders()]}, "
                f"dead {[r.name for r in schedule.replicas.values() if r.dead]}"
            )
            await schedule.wait(1.0)

    async def _can_scale_up(self, leader: Any) -> bool:
        for config in leader.config.node_groups:
            size = await leader.call(
                "NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=config.name), 5.0
            )
            if size.ok and size.reply.targetSize < config.max_size:
                request = pb.NodeGroupIncreaseSizeRequest(id=config.name, delta=1)
                return (await leader.call("NodeGroupIncreaseSize", request, 5.0)).ok
        return True  # every group full: nothing to ask, and Refresh answered
