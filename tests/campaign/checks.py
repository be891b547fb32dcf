"""The campaign's invariants, each an async check over the real server (gRPC, mTLS) and the
emulator's admin view. Every failure message names the group, the numbers and the ids.

White-box reads: exactly one, `in_flight`, documented there.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from fixtures.stack import Stack, wait_until

from campaign.world import call
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP, TAG_REQUEST
from cloudscale_autoscaler.engine.inventory import ADOPTED_BOUND_FACTOR
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

DELETING = pb.InstanceStatus.instanceDeleting
PLACEHOLDER_PREFIX = "cloudscale://failed-"
_SERVER_ID = re.compile(
    r"cloudscale://[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)
_PLACEHOLDER_ID = re.compile(re.escape(PLACEHOLDER_PREFIX) + r"[0-9A-Za-z_-]+")


@dataclass
class Ledger:
    """What the test asked for, to judge the cloud's deletion log against."""

    cluster: str
    groups: Mapping[str, int]  # group -> maxSize
    # (group, uuid) pairs some DeleteNodes asked to delete (CA-style or adversarial).
    requested: set[tuple[str, str]] = field(default_factory=set)
    # Servers someone else created with our tags: they join a group whatever its maxSize.
    manual: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class InFlight:
    unacked: frozenset[str]  # request ids of creations the API has not acknowledged yet
    deleting: frozenset[str]  # uuids of servers being deleted that still count (tag unseen)


def in_flight(stack: Stack, group: str) -> InFlight:
    """WHITE-BOX, the campaign's only one: the work in flight that the wire cannot show.

    - Creations the API has not acknowledged: TargetSize counts them, but NodeGroupNodes
      cannot show them (no server uuid yet; engine/group.py leaves them out rather than
      inventing ids, and CA counts the difference as upcoming nodes).
    - Deletions under way whose deletion tag the engine has not seen yet: such a server
      still counts, but its instance looks exactly like one whose deletion finished while
      the API still lists it (both "Deleting"). Once the tag is seen (our PATCH, or the
      listing after a restart) it no longer counts. A DeleteNodes cut short by the deadline
      leaves its deletions running between steps.
    Call on the loop (engine state is loop-confined).
    """
    state = stack.provider.service.engine._inventory.groups[group]
    return InFlight(
        frozenset(c.request_id for c in state.pending_creations() if c.uuid is None),
        frozenset(
            u for u in state.deleting if u in state.servers and not state.deletion_requested(u)
        ),
    )


def creations_in_flight(stack: Stack) -> dict[str, int]:
    """Creations started and not yet listed, per group (the engine's public metrics view)."""
    return {s.name: s.creations_in_flight for s in stack.provider.service.engine.group_stats()}


async def target(stack: Stack, group: str) -> int:
    outcome = await call(
        "NodeGroupTargetSize",
        stack.stub.NodeGroupTargetSize,
        pb.NodeGroupTargetSizeRequest(id=group),
    )  # TargetSize must never fail for a configured group (CA issue #10132)
    return int(outcome.reply.targetSize)


async def instances(stack: Stack, group: str) -> list[pb.Instance]:
    outcome = await call(
        "NodeGroupNodes", stack.stub.NodeGroupNodes, pb.NodeGroupNodesRequest(id=group)
    )
    found = list(outcome.reply.instances)
    check_instance_ids(group, found)
    return found


def check_instance_ids(group: str, found: Iterable[pb.Instance]) -> None:
    ids = [i.id for i in found]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"group {group}: NodeGroupNodes lists ids twice: {duplicates}"
    malformed = [i for i in ids if not (_SERVER_ID.fullmatch(i) or _PLACEHOLDER_ID.fullmatch(i))]
    assert not malformed, f"group {group}: malformed instance ids {malformed}"


def is_placeholder(instance: pb.Instance) -> bool:
    return instance.id.startswith(PLACEHOLDER_PREFIX)


def uuid_of(instance: pb.Instance) -> str:
    return instance.id.removeprefix("cloudscale://")


async def check_target_accounting(
    stack: Stack, ledger: Ledger, group: str, servers: list[dict[str, Any]]
) -> None:
    """0 <= target <= maxSize (+ others' servers) and target = servers + unacknowledged
    creations + placeholders,
    from the server's own answers; and every create request counted once (no server shown
    while its creation or a placeholder for it still counts too).

    An instance in state Deleting no longer counts once our deletion finished (slow deletes
    keep it listed a while); one whose deletion is still under way does (`in_flight`).
    `servers` is the emulator's listing, read before this check."""
    for _ in range(200):
        before = in_flight(stack, group)
        size = await target(stack, group)
        listed = await instances(stack, group)
        if in_flight(stack, group) == before:  # nothing acknowledged, failed or deleted
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"group {group}: work in flight kept changing; no stable view")
    placeholders = [i for i in listed if is_placeholder(i)]
    live = [
        i
        for i in listed
        if not is_placeholder(i)
        and (i.status.instanceState != DELETING or uuid_of(i) in before.deleting)
    ]
    # IncreaseSize never goes beyond maxSize; servers created by someone else with our tags
    # join the group at the next listing no matter what (CA then scales the group down).
    maximum = ledger.groups[group] + sum(1 for i in live if uuid_of(i) in ledger.manual)
    assert 0 <= size <= maximum, f"group {group}: target {size} outside [0, {maximum}]"
    assert size == len(live) + len(placeholders) + len(before.unacked), (
        f"group {group}: target {size} != {len(live)} servers + {len(before.unacked)} "
        f"unacknowledged creations + {len(placeholders)} placeholders; instances "
        f"{[(i.id, i.status.instanceState) for i in listed]}"
    )
    request_of = {s["uuid"]: (s.get("tags") or {}).get(TAG_REQUEST) for s in servers}
    counted = before.unacked | {i.id.removeprefix(PLACEHOLDER_PREFIX) for i in placeholders}
    twice = {
        i.id: request_of.get(uuid_of(i)) for i in live if request_of.get(uuid_of(i)) in counted
    }
    assert not twice, (
        f"group {group}: servers counted twice (also as creation/placeholder): {twice}"
    )


def check_no_orphans(ledger: Ledger, servers: list[dict[str, Any]]) -> None:
    """Every server we created (our naming, or our request tag) carries both identity tags."""
    prefix = f"{ledger.cluster}-"
    for server in servers:
        tags = server.get("tags") or {}
        ours = server["name"].startswith(prefix) or TAG_REQUEST in tags
        if not ours:
            continue
        assert tags.get(TAG_CLUSTER) == ledger.cluster and tags.get(TAG_GROUP) in ledger.groups, (
            f"orphan: server {server['name']} ({server['uuid']}) has tags {tags}"
        )


def check_deletions(ledger: Ledger, deletions: list[dict[str, Any]]) -> None:
    """The API deleted only servers of this cluster, of the group a DeleteNodes named, that
    the DeleteNodes asked for."""
    for entry in deletions:
        if entry["by"] != "api":
            continue
        tags = entry.get("tags") or {}
        group = tags.get(TAG_GROUP)
        where = f"server {entry['name']} ({entry['uuid']}) with tags {tags}"
        assert tags.get(TAG_CLUSTER) == ledger.cluster, f"deleted outside the cluster: {where}"
        assert group in ledger.groups, f"deleted outside any configured group: {where}"
        assert (group, entry["uuid"]) in ledger.requested, (
            f"deleted without a DeleteNodes for it in group {group}: {where}"
        )


def cloud_members(ledger: Ledger, servers: list[dict[str, Any]], group: str) -> set[str]:
    want = {TAG_CLUSTER: ledger.cluster, TAG_GROUP: group}
    return {
        s["uuid"]
        for s in servers
        if all((s.get("tags") or {}).get(k) == v for k, v in want.items())
    }


async def check_step(stack: Stack, ledger: Ledger) -> None:
    """Everything checked after every step."""
    admin = stack.admin
    servers = await admin.servers()
    check_no_orphans(ledger, servers)
    check_deletions(ledger, await admin.deletions())
    for group in ledger.groups:
        await check_target_accounting(stack, ledger, group, servers)


async def check_converged(stack: Stack, ledger: Ledger, limit: float = 45.0) -> None:
    """With the faults off: after the creations in flight finish and a Refresh, every group's
    target equals the servers the cloud holds for it plus its placeholders, the instances are
    exactly those servers, and no creation is left in flight. A create adopted from the
    journal that was never sent stays in flight for the adoption bound (by design: nothing
    tells it from one the API is still carrying out), so the wait lasts at least that long."""
    admin = stack.admin
    bound = ADOPTED_BOUND_FACTOR * stack.config.cloudscale.timeout_seconds
    limit = max(limit, bound + 15.0)
    await admin.clear_faults()

    async def lingering_gone() -> bool:
        deleted = {d["uuid"] for d in await admin.deletions()}
        return not any(s["uuid"] in deleted for s in await admin.servers())

    async def nothing_in_flight() -> bool:
        outcome = await call(
            "Refresh", stack.stub.Refresh, pb.RefreshRequest(), [grpc.StatusCode.UNAVAILABLE]
        )
        deleting = any(in_flight(stack, group).deleting for group in ledger.groups)
        return outcome.ok and not deleting and not any(creations_in_flight(stack).values())

    await wait_until(lingering_gone, limit, "slow deletions to finish")
    await wait_until(nothing_in_flight, limit, f"work in flight: {creations_in_flight(stack)}")
    servers = await admin.servers()
    for group in ledger.groups:
        size = await target(stack, group)
        listed = await instances(stack, group)
        placeholders = [i for i in listed if is_placeholder(i)]
        shown = {uuid_of(i) for i in listed if not is_placeholder(i)}
        members = cloud_members(ledger, servers, group)
        assert shown == members, (
            f"group {group}: instances {sorted(shown)} != cloud servers {sorted(members)}"
        )
        assert size == len(members) + len(placeholders), (
            f"group {group}: converged target {size} != {len(members)} cloud servers + "
            f"{len(placeholders)} placeholders"
        )
    await check_step(stack, ledger)
