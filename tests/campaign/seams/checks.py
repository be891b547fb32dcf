"""The seams campaign's invariants, read after every step from the emulator's state (in the
same process) and the replicas' answers; each failure names the group, the numbers and the ids.

- at most one replica serves at a time;
- no group holds more servers than the largest maxSize it had (servers whose deletion was
  requested excepted: they are going, and CA's target no longer counts them);
- one create request tag makes at most one server;
- the API deleted only servers some DeleteNodes of their group named;
- after a Refresh of the replica serving: every server of the cluster is in a configured group
  or reported as a removed group's, and the target adds up (servers + creates not yet
  answered + placeholders).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from campaign.seams.world import CLUSTER, Schedule
from cloudscale_autoscaler.cloud.emulator.records import ServerRecord
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_DELETION, TAG_GROUP, TAG_REQUEST
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

PLACEHOLDER = "cloudscale://failed-"


def ours(schedule: Schedule) -> list[ServerRecord]:
    """The cluster's servers the API still has (lingering deletions included)."""
    state = schedule.emulator.state
    state.purge()
    return [r for r in state.servers.values() if r.tags.get(TAG_CLUSTER) == CLUSTER]


def check_step(schedule: Schedule) -> None:
    serving = [r.name for r in schedule.leaders()]
    assert len(serving) <= 1, f"two replicas serve at once: {serving}"
    servers = ours(schedule)
    check_ceiling(schedule, servers)
    check_one_server_per_request(servers)
    check_deletions(schedule)


def check_ceiling(schedule: Schedule, servers: list[ServerRecord]) -> None:
    held = Counter(
        r.tags.get(TAG_GROUP)
        for r in servers
        if r.deleting_until is None and TAG_DELETION not in r.tags and r.uuid not in schedule.manual
    )
    for name, count in held.items():
        ceiling = schedule.ceiling.get(str(name), 0)
        assert count <= ceiling, (
            f"group {name} holds {count} servers, more than the largest maxSize it had "
            f"({ceiling}): {sorted(r.name for r in servers if r.tags.get(TAG_GROUP) == name)}"
        )


def check_one_server_per_request(servers: list[ServerRecord]) -> None:
    requests = Counter(r.tags[TAG_REQUEST] for r in servers if TAG_REQUEST in r.tags)
    doubled = {request: n for request, n in requests.items() if n > 1}
    assert not doubled, f"one create request made several servers: {doubled}"


def check_deletions(schedule: Schedule) -> None:
    for entry in schedule.emulator.state.deletions:
        if entry["by"] != "api":
            continue
        tags = entry.get("tags") or {}
        where = f"server {entry['name']} ({entry['uuid']}) with tags {tags}"
        assert tags.get(TAG_CLUSTER) == CLUSTER, f"deleted outside the cluster: {where}"
        assert (tags.get(TAG_GROUP), entry["uuid"]) in schedule.requested, (
            f"deleted without a DeleteNodes of its group naming it: {where}"
        )


async def check_after_refresh(schedule: Schedule) -> bool:
    """CA's Refresh of the replica serving; then what it serves and reports adds up. Whether
    the Refresh succeeded."""
    replica = schedule.leader()
    before = {r.uuid: r.tags.get(TAG_GROUP) for r in ours(schedule)}
    answer = await schedule.ca("Refresh", pb.RefreshRequest(), ("UNAVAILABLE",))
    if replica is None or answer is None or not answer.ok or not replica.serving:
        return False
    configured = {g.name for g in replica.config.node_groups}
    removed = replica.engine.removed_groups()
    for uuid, name in before.items():
        if uuid in schedule.manual or name in configured:
            continue
        left = removed.get(str(name))
        assert left is not None and left.servers > 0, (
            f"server {uuid} of group {name}, not configured on {replica.name}, is not reported "
            f"as a removed group's: {sorted(removed)}"
        )
    for name in configured:
        await check_target(schedule, replica, name)
    return True


async def check_target(schedule: Schedule, replica: Any, name: str) -> None:
    """target = servers shown (less those going) + creates not answered yet + placeholders.
    The calls take virtual time, in which creates are answered and deletions go on: the check
    holds only when the group's work read before the calls equals the work read after them."""
    state = replica.engine._inventory.groups.get(name)  # white-box: work the wire cannot show
    if state is None:
        return
    before = _work(state)
    size = await replica.call("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=name), 5.0)
    nodes = await replica.call("NodeGroupNodes", pb.NodeGroupNodesRequest(id=name), 5.0)
    if not (size.ok and nodes.ok):
        return  # it stopped serving meanwhile
    if replica.engine._inventory.groups.get(name) is not state or _work(state) != before:
        return  # it moved meanwhile
    unanswered, deleting = before
    instances = list(nodes.reply.instances)
    placeholders = [i for i in instances if i.id.startswith(PLACEHOLDER)]
    going = pb.InstanceStatus.instanceDeleting
    live = [
        i
        for i in instances
        if not i.id.startswith(PLACEHOLDER)
        and (i.status.instanceState != going or i.id.removeprefix("cloudscale://") in deleting)
    ]
    target = size.reply.targetSize
    assert target == len(live) + unanswered + len(placeholders), (
        f"{replica.name}: group {name}: target {target} != {len(live)} servers + {unanswered} "
        f"creates not answered + {len(placeholders)} placeholders"
    )


def _work(state: Any) -> tuple[int, frozenset[str]]:
    """The group's creates not answered yet and the servers it is deleting, still counted."""
    unanswered = sum(1 for c in state.pending_creations() if c.uuid is None)
    deleting = {u for u in state.deleting if u in state.servers and not state.deletion_requested(u)}
    return unanswered, frozenset(deleting)
