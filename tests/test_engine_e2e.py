"""The engine end to end: CA-style RPCs over mTLS gRPC to the real server, against the emulator.

Every check reads state (RPC answers, the emulator's servers and deletion log), never clocks.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import grpc
import httpx
import pytest
from fixtures.stack import CLUSTER, Stack, StackFactory, group, group_tags, wait_until

from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_REQUEST
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

CREATING = pb.InstanceStatus.instanceCreating
RUNNING = pb.InstanceStatus.instanceRunning
DELETING = pb.InstanceStatus.instanceDeleting


def pid(uuid: str) -> str:
    return f"cloudscale://{uuid}"


def fake_node(instance_id: str) -> pb.ExternalGrpcNode:
    """What CA sends for instances that never became nodes: providerID = name = instance id."""
    return pb.ExternalGrpcNode(providerID=instance_id, name=instance_id)


def node_of(server: dict[str, Any]) -> pb.ExternalGrpcNode:
    """A registered node as CA sends it (CCM providerID, hostname = server name)."""
    return pb.ExternalGrpcNode(
        providerID=pid(server["uuid"]),
        name=server["name"],
        labels={"kubernetes.io/hostname": server["name"]},
    )


async def increase(s: Stack, group_id: str, delta: int) -> None:
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group_id, delta=delta))


async def delete(s: Stack, group_id: str, nodes: list[pb.ExternalGrpcNode]) -> None:
    await s.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=group_id, nodes=nodes))


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_scale_from_zero_to_n_and_back_to_min(stack: StackFactory) -> None:
    s = await stack(
        [group("workers", 0, 6, volume_size_gb=20, tags=(("team", "infra"),), zone="rma1")]
    )
    await s.refresh()
    assert await s.target("workers") == 0
    await increase(s, "workers", 4)
    assert await s.target("workers") == 4
    await s.settle("workers")

    servers = await s.cloud_servers("workers")
    assert len(servers) == 4
    for server in servers:
        assert re.fullmatch(rf"{CLUSTER}-workers-[a-z0-9]{{8}}", server["name"])
        assert server["flavor"]["slug"] == "flex-4-2"
        assert server["zone"]["slug"] == "rma1"
        assert server["volumes"][0]["size_gb"] == 20
        assert server["tags"]["team"] == "infra"
        assert server["tags"][TAG_REQUEST]
    assert len({server["name"] for server in servers}) == 4
    instances = await s.instances("workers")
    assert sorted(i.id for i in instances) == sorted(pid(x["uuid"]) for x in servers)
    assert all(i.status.instanceState == RUNNING for i in instances)

    # Scale down to min (0): two at a time, as CA would.
    await delete(s, "workers", [node_of(x) for x in servers[:2]])
    assert await s.target("workers") == 2
    await delete(s, "workers", [node_of(x) for x in servers[2:]])
    assert await s.target("workers") == 0
    await s.settle("workers")
    assert await s.cloud_servers("workers") == []
    deleted = {d["uuid"] for d in await s.admin.deletions()}
    assert deleted == {x["uuid"] for x in servers}


async def test_two_of_five_creations_fail_into_placeholders(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    await s.admin.set_faults({"fail_next_creates": {"count": 2, "kind": "quota"}})
    await increase(s, "workers", 5)
    await s.settle("workers")
    assert await s.target("workers") == 5
    assert len(await s.cloud_servers("workers")) == 3

    failed = [i for i in await s.instances("workers") if i.status.errorInfo.errorCode]
    assert len(failed) == 2
    for instance in failed:
        assert instance.id.startswith("cloudscale://failed-")
        assert instance.status.instanceState == CREATING
        info = instance.status.errorInfo
        assert info.errorCode == "QUOTA_EXCEEDED"
        assert info.instanceErrorClass == 1
        assert "Quota exceeded" in info.errorMessage

    # CA deletes failed instances with fake nodes; no server is touched, the target rolls back.
    await delete(s, "workers", [fake_node(i.id) for i in failed])
    assert await s.target("workers") == 3
    assert await s.admin.deletions() == []
    # Repeating it (CA retries every loop until the instance is gone) is harmless.
    await delete(s, "workers", [fake_node(failed[0].id)])
    assert await s.target("workers") == 3


@pytest.mark.parametrize(
    ("kind", "code", "error_class"),
    [("capacity", "ZONE_CAPACITY_EXHAUSTED", 1), ("invalid", "INVALID_REQUEST", 99)],
)
async def test_placeholder_error_classes(
    stack: StackFactory, kind: str, code: str, error_class: int
) -> None:
    s = await stack([group("workers", 0, 10)])
    await s.admin.set_faults({"fail_next_creates": {"count": 1, "kind": kind}})
    await increase(s, "workers", 2)
    await s.settle("workers")
    failed = [i for i in await s.instances("workers") if i.status.errorInfo.errorCode]
    assert [
        (i.status.errorInfo.errorCode, i.status.errorInfo.instanceErrorClass) for i in failed
    ] == [(code, error_class)]


async def test_unknown_flavor_is_refused_before_any_create(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10, flavor="no-such-flavor")])
    error = await rpc_error(increase(s, "workers", 3))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "flavor 'no-such-flavor' is not offered by the cloud" in (error.details() or "")
    assert await s.target("workers") == 0
    assert "create_server" not in await s.admin.stats()


async def test_flavor_outside_the_zone_is_refused_before_any_create(stack: StackFactory) -> None:
    # The emulator offers GPU flavors in rma1 only.
    s = await stack([group("gpu", 0, 2, flavor="gpu2-128-16-1-200", zone="lpg1")])
    error = await rpc_error(increase(s, "gpu", 1))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is not offered in zone 'lpg1' (only in: rma1)" in (error.details() or "")
    assert await s.target("gpu") == 0


async def test_every_creation_rejected_at_once_returns_the_error_and_rolls_back(
    stack: StackFactory,
) -> None:
    # A generous wait makes "at once" deterministic on a loaded machine.
    s = await stack([group("workers", 0, 10)], increase_size_wait_seconds=10.0)
    await s.admin.set_faults({"fail_next_creates": {"count": 3, "kind": "invalid"}})
    error = await rpc_error(increase(s, "workers", 3))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "rolled back" in (error.details() or "")
    assert "Emulated invalid request" in (error.details() or "")
    assert await s.target("workers") == 0
    assert await s.instances("workers") == []


async def test_rejections_after_the_wait_become_placeholders(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)], increase_size_wait_seconds=0.0)
    await s.admin.set_faults(
        {
            "latency": {"create_server": {"fixed_ms": 200, "jitter_ms": 0}},
            "fail_next_creates": {"count": 2, "kind": "quota"},
        }
    )
    await increase(s, "workers", 2)  # returns before the API answers
    assert await s.target("workers") == 2
    await s.settle("workers")
    failed = [i for i in await s.instances("workers") if i.status.errorInfo.errorCode]
    assert [i.status.errorInfo.errorCode for i in failed] == ["QUOTA_EXCEEDED"] * 2
    assert await s.target("workers") == 2  # until CA deletes the placeholders
    await delete(s, "workers", [fake_node(i.id) for i in failed])
    assert await s.target("workers") == 0


async def test_increase_size_validation(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 3)])
    await s.admin.populate(2, group_tags("workers"))
    await s.refresh()
    cases = [
        ("nope", 1, grpc.StatusCode.NOT_FOUND),
        ("workers", 0, grpc.StatusCode.INVALID_ARGUMENT),
        ("workers", -1, grpc.StatusCode.INVALID_ARGUMENT),
        ("workers", 2, grpc.StatusCode.FAILED_PRECONDITION),
    ]
    for group_id, delta, code in cases:
        error = await rpc_error(increase(s, group_id, delta))
        assert error.code() == code, (group_id, delta)
    assert "maxSize 3" in (error.details() or "")
    assert await s.target("workers") == 2
    assert len(await s.cloud_servers("workers")) == 2


async def test_delete_nodes_refuses_foreign_servers_deleting_nothing(
    stack: StackFactory,
) -> None:
    s = await stack([group("workers", 0, 10), group("other", 0, 10)])
    [mine] = await s.admin.populate(1, group_tags("workers"))
    [sibling] = await s.admin.populate(1, group_tags("other"))
    [foreign] = await s.admin.populate(1, group_tags("workers", cluster="another-cluster"))
    [untagged] = await s.admin.populate(1, {})
    [cluster_only] = await s.admin.populate(1, {TAG_CLUSTER: CLUSTER})
    await s.refresh()
    for stranger, why in [
        (sibling, "node group other"),
        (foreign, "not in node group workers"),
        (untagged, "not in node group workers"),
        (cluster_only, "not in node group workers"),
        ("not-a-uuid", "not a cloudscale server"),
    ]:
        nodes = [
            pb.ExternalGrpcNode(providerID=pid(mine), name="mine"),
            pb.ExternalGrpcNode(providerID=pid(stranger), name="stranger"),
        ]
        error = await rpc_error(delete(s, "workers", nodes))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "stranger" in (error.details() or "") and why in (error.details() or "")
    foreign_node = pb.ExternalGrpcNode(providerID="aws:///eu-west-1a/i-0abc", name="ec2")
    error = await rpc_error(delete(s, "workers", [foreign_node]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await s.admin.deletions() == []
    assert await s.target("workers") == 1


async def test_delete_nodes_unknown_group_and_no_nodes(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    error = await rpc_error(delete(s, "nope", [fake_node("cloudscale://failed-x")]))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = await rpc_error(delete(s, "workers", []))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_delete_nodes_refuses_below_min_size(stack: StackFactory) -> None:
    s = await stack([group("workers", 2, 10)])
    uuids = await s.admin.populate(3, group_tags("workers"))
    await s.refresh()
    nodes = [pb.ExternalGrpcNode(providerID=pid(u)) for u in uuids[:2]]
    error = await rpc_error(delete(s, "workers", nodes))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "minSize 2" in (error.details() or "")
    assert await s.admin.deletions() == []
    await delete(s, "workers", nodes[:1])
    assert await s.target("workers") == 2
    assert [d["uuid"] for d in await s.admin.deletions()] == [uuids[0]]


async def test_delete_of_server_deleted_behind_our_back_succeeds(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    uuids = await s.admin.populate(3, group_tags("workers"))
    await s.refresh()
    # Gone before DeleteNodes re-lists: remembered as ours, so deleting it again is success.
    await s.admin.delete_server(uuids[0])
    await delete(s, "workers", [pb.ExternalGrpcNode(providerID=pid(uuids[0]))])
    assert await s.target("workers") == 2

    # Gone while our DELETE is on its way (the API answers 404): also a success.
    await s.admin.set_faults({"latency": {"delete_server": {"fixed_ms": 1500}}})
    call = asyncio.ensure_future(
        delete(s, "workers", [pb.ExternalGrpcNode(providerID=pid(uuids[1]))])
    )

    async def deleting() -> bool:
        states = {i.id: i.status.instanceState for i in await s.instances("workers")}
        return states.get(pid(uuids[1])) == DELETING

    await wait_until(deleting, what="delete in flight")
    await s.admin.delete_server(uuids[1])
    await call
    assert await s.target("workers") == 1
    stats = await s.admin.stats()
    assert stats["delete_server"].get("404") == 1


async def test_refresh_reconciles_manual_changes(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    uuids = await s.admin.populate(3, group_tags("workers"))
    await s.refresh()
    assert await s.target("workers") == 3
    await s.admin.delete_server(uuids[0])
    await s.refresh()
    assert await s.target("workers") == 2
    await s.admin.create_server("manual", tags=group_tags("workers"))
    await s.refresh()
    assert await s.target("workers") == 3


async def test_failed_refresh_keeps_inventory(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    await s.admin.populate(2, group_tags("workers"))
    await s.refresh()
    await s.admin.set_faults({"down": True})
    error = await rpc_error(s.refresh())
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert await s.target("workers") == 2
    assert len(await s.instances("workers")) == 2


async def test_restart_rebuilds_targets_from_the_cloud(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10), group("other", 1, 5)])
    await s.admin.populate(2, group_tags("other"))
    await s.refresh()
    await increase(s, "workers", 3)
    await s.settle("workers")
    before = (await s.target("workers"), await s.target("other"))
    assert before == (3, 2)
    s2 = await s.restart()
    # No Refresh needed: the server loads the inventory when it starts.
    assert (await s2.target("workers"), await s2.target("other")) == before
    await s2.refresh()
    assert (await s2.target("workers"), await s2.target("other")) == before


async def test_increase_size_returns_while_creations_are_in_flight(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    await s.refresh()
    await s.admin.set_faults({"latency": {"create_server": {"fixed_ms": 10_000}}})
    await increase(s, "workers", 3)
    assert await s.target("workers") == 3  # counted at once, before anything is sent

    async def all_sent() -> bool:  # once the creation journal holds them
        return (await s.cloud_in_flight()).get("create_server") == 3

    await wait_until(all_sent, what="three creates sent")
    # Returned, yet nothing is created: the creations are still in flight.
    assert await s.cloud_servers("workers") == []
    assert await s.target("workers") == 3
    assert await s.instances("workers") == []  # no instance ids before the API answers
    await s.admin.clear_faults()
    # They complete in the background and are counted exactly once.
    await s.settle("workers")
    assert await s.target("workers") == 3
    assert len(await s.cloud_servers("workers")) == 3


async def test_decrease_target_size(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)], cloudscale={"max_concurrent_creates": 1})
    await s.admin.populate(1, group_tags("workers"))
    await s.refresh()

    async def decrease(delta: int) -> None:
        await s.stub.NodeGroupDecreaseTargetSize(
            pb.NodeGroupDecreaseTargetSizeRequest(id="workers", delta=delta)
        )

    for delta in (0, 1):
        error = await rpc_error(decrease(delta))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = await rpc_error(decrease(-1))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "would delete existing nodes" in (error.details() or "")

    # One creation sent (slow) and three queued behind the concurrency bound of 1.
    await s.admin.set_faults({"latency": {"create_server": {"fixed_ms": 3000}}})
    await increase(s, "workers", 4)
    assert await s.target("workers") == 5

    async def one_sent() -> bool:  # once the creation journal holds them
        return (await s.cloud_in_flight()).get("create_server") == 1

    await wait_until(one_sent, what="the first create sent")
    error = await rpc_error(decrease(-4))  # only 3 are unsent
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await s.target("workers") == 5
    await decrease(-3)
    assert await s.target("workers") == 2
    await s.settle("workers")
    assert await s.target("workers") == 2
    assert len(await s.cloud_servers("workers")) == 2


async def test_delete_nodes_rechecks_tags_against_the_cloud(
    stack: StackFactory, emulator_client: httpx.AsyncClient
) -> None:
    s = await stack([group("workers", 0, 10), group("other", 0, 10)])
    moved, untagged, kept = await s.admin.populate(3, group_tags("workers"))
    await s.refresh()
    # Tags change after the last Refresh: the stale inventory still has both in "workers".
    for uuid, tags in [(moved, group_tags("other")), (untagged, {"team": "x"})]:
        response = await emulator_client.patch(f"servers/{uuid}", json={"tags": tags})
        response.raise_for_status()
    error = await rpc_error(delete(s, "workers", [pb.ExternalGrpcNode(providerID=pid(moved))]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "node group other" in (error.details() or "")
    # No longer tagged for us at all: never deleted (it left the group; CA is told it is gone).
    await delete(s, "workers", [pb.ExternalGrpcNode(providerID=pid(untagged))])
    assert await s.admin.deletions() == []
    assert await s.target("workers") == 1
    await delete(s, "workers", [pb.ExternalGrpcNode(providerID=pid(kept))])
    assert [d["uuid"] for d in await s.admin.deletions()] == [kept]
