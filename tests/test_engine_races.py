"""Races and faults: concurrent RPCs, lost responses, lingering deletes, cancelled calls,
placeholder expiry, shutdown with work in flight. All over mTLS gRPC against the emulator.

The invariant checked everywhere, once things settle:
    target == servers the cloud lists for the group + failed-creation placeholders
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from fixtures.stack import Stack, StackFactory, group, group_tags, wait_until

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

DELETING = pb.InstanceStatus.instanceDeleting


def node(uuid: str) -> pb.ExternalGrpcNode:
    return pb.ExternalGrpcNode(providerID=f"cloudscale://{uuid}", name=f"node-{uuid[:8]}")


async def placeholders(s: Stack, group_id: str) -> list[pb.Instance]:
    return [i for i in await s.instances(group_id) if i.id.startswith("cloudscale://failed-")]


async def placeholders_appear(s: Stack, group_id: str, count: int) -> list[pb.Instance]:
    """The group's placeholders once there are `count`: a failure may come after IncreaseSize
    answered (its creates are recorded in the journal first)."""

    async def there() -> bool:
        return len(await placeholders(s, group_id)) == count

    await wait_until(there, what=f"{count} placeholder(s) in {group_id}")
    return await placeholders(s, group_id)


async def assert_consistent(s: Stack, group_id: str) -> int:
    await s.settle(group_id)
    servers = len(await s.cloud_servers(group_id))
    failed = len(await placeholders(s, group_id))
    target = await s.target(group_id)
    assert target == servers + failed
    return target


async def test_concurrent_increase_delete_refresh_stay_consistent(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 30)], cloudscale={"max_concurrent_creates": 3})
    uuids = await s.admin.populate(6, group_tags("workers"))
    await s.refresh()
    await s.admin.set_faults({"latency": {"*": {"fixed_ms": 20, "jitter_ms": 80}}})

    async def inc(delta: int) -> None:
        await s.stub.NodeGroupIncreaseSize(
            pb.NodeGroupIncreaseSizeRequest(id="workers", delta=delta)
        )

    async def rm(batch: list[str]) -> None:
        nodes = [node(u) for u in batch]
        await s.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="workers", nodes=nodes))

    calls = [
        inc(3), s.refresh(), rm(uuids[:2]), inc(2), s.refresh(), rm(uuids[2:3]),
        rm(uuids[:1]), inc(1), s.refresh(), rm(uuids[3:5]), s.refresh(),
    ]  # fmt: skip
    await asyncio.gather(*calls)
    await s.admin.clear_faults()
    # 6 existing + 6 created - 5 distinct deleted (uuids[0] twice: once counted).
    assert await assert_consistent(s, "workers") == 7
    assert len(await s.admin.deletions()) == 5


@pytest.mark.parametrize("mode", ["drop", "504"])
async def test_lost_create_responses_are_counted_once(stack: StackFactory, mode: str) -> None:
    s = await stack([group("workers", 0, 10)])
    await s.refresh()
    await s.admin.set_faults({"lose_create_responses": {"count": 2, "mode": mode}})
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=3))
    # Refreshing while the client recovers the lost responses must never double count.
    for _ in range(10):
        await s.refresh()
        assert await s.target("workers") == 3
    assert await assert_consistent(s, "workers") == 3
    assert len(await s.cloud_servers("workers")) == 3


async def test_slow_deletes_show_deleting_and_are_not_recounted(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    uuids = await s.admin.populate(3, group_tags("workers"))
    await s.refresh()
    await s.admin.set_faults({"slow_deletes_seconds": 2})
    await s.stub.NodeGroupDeleteNodes(
        pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node(uuids[0])])
    )
    await s.refresh()  # the server is still listed (status changing)
    states = {i.id: i.status.instanceState for i in await s.instances("workers")}
    assert states[f"cloudscale://{uuids[0]}"] == DELETING
    assert await s.target("workers") == 2
    # Deleting it again while it lingers is a no-op success, not a second DELETE.
    await s.stub.NodeGroupDeleteNodes(
        pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node(uuids[0])])
    )
    assert await s.target("workers") == 2

    async def gone() -> bool:
        await s.refresh()
        return len(await s.instances("workers")) == 2

    await wait_until(gone, what="lingering server gone")
    assert await s.target("workers") == 2
    assert len(await s.admin.deletions()) == 1


async def test_deletion_outlives_a_cancelled_rpc(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    uuids = await s.admin.populate(2, group_tags("workers"))
    await s.refresh()
    await s.admin.set_faults({"latency": {"delete_server": {"fixed_ms": 1000}}})
    request = pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node(uuids[0])])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupDeleteNodes(request, timeout=0.3)
    # UNAVAILABLE: the service gives up just before the deadline (service/provider.py).
    assert caught.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)

    async def deleted() -> bool:
        return len(await s.admin.deletions()) == 1

    await wait_until(deleted, what="deletion finished after the RPC was cancelled")
    await s.admin.clear_faults()
    assert await assert_consistent(s, "workers") == 1


async def test_placeholders_expire(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)], placeholder_expiry_seconds=3.0)
    await s.admin.set_faults({"fail_next_creates": {"count": 1, "kind": "quota"}})
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    [failed] = await placeholders_appear(s, "workers", 1)
    assert await s.target("workers") == 2

    async def expired() -> bool:
        return await s.target("workers") == 1

    await wait_until(expired, what="placeholder expiry")
    assert await placeholders(s, "workers") == []
    # CA may still send the fake node it saw before: an idempotent success.
    fake = pb.ExternalGrpcNode(providerID=failed.id, name=failed.id)
    await s.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[fake]))
    assert await assert_consistent(s, "workers") == 1


async def test_placeholder_unknown_to_the_group_is_refused(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10), group("other", 0, 10)])
    await s.admin.set_faults({"fail_next_creates": {"count": 1, "kind": "quota"}})
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    [failed] = await placeholders_appear(s, "workers", 1)
    fake = pb.ExternalGrpcNode(providerID=failed.id, name=failed.id)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="other", nodes=[fake]))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len(await placeholders(s, "workers")) == 1


async def test_restart_with_creations_in_flight(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)], cloudscale={"max_concurrent_creates": 1})
    await s.refresh()
    await s.admin.set_faults({"latency": {"create_server": {"fixed_ms": 800}}})
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=4))

    async def sent() -> bool:
        return (await s.admin.in_flight()).get("create_server", 0) > 0

    await wait_until(sent, what="the first create sent")
    # Shutdown lets the request already sent finish and drops the queued ones.
    s2 = await s.restart()
    await s2.admin.clear_faults()
    created = len(await s2.cloud_servers("workers"))
    assert 1 <= created < 4
    assert await s2.target("workers") == created
    assert await assert_consistent(s2, "workers") == created


async def test_partial_delete_failure_names_failed_nodes_and_keeps_successes(
    stack: StackFactory,
) -> None:
    s = await stack([group("workers", 0, 10)])
    uuids = await s.admin.populate(6, group_tags("workers"))
    await s.refresh()
    # 403 is final for the client (no retry); the seeded RNG makes the split deterministic.
    await s.admin.set_faults({"error_rate": {"delete_server": {"rate": 0.5, "status": 403}}})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupDeleteNodes(
            pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node(u) for u in uuids])
        )
    await s.admin.clear_faults()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    details = caught.value.details() or ""
    deleted = {d["uuid"] for d in await s.admin.deletions()}
    assert 0 < len(deleted) < 6, "the seed should split the six deletions"
    for uuid in uuids:
        assert (f"node-{uuid[:8]}" in details) == (uuid not in deleted)
    assert await s.target("workers") == 6 - len(deleted)
    assert await assert_consistent(s, "workers") == 6 - len(deleted)


async def test_mutations_load_the_inventory_when_start_could_not(stack: StackFactory) -> None:
    s0 = await stack([group("workers", 0, 3)])
    await s0.admin.populate(2, group_tags("workers"))
    # 403 is final for the client (no retries): the startup listing fails at once.
    await s0.admin.set_faults({"error_rate": {"list_servers": {"rate": 1.0, "status": 403}}})
    s = await s0.restart()  # starts while the cloud is down: no inventory
    await s.admin.clear_faults()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await s.target("workers") == 2


async def test_group_stats_follow_the_targets(stack: StackFactory) -> None:
    s = await stack([group("workers", 1, 10)])
    await s.admin.populate(2, group_tags("workers"))
    await s.refresh()
    await s.admin.set_faults({"fail_next_creates": {"count": 1, "kind": "quota"}})
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    await s.settle("workers")
    [stats] = s.provider.service.engine.group_stats()
    assert (stats.name, stats.min_size, stats.max_size) == ("workers", 1, 10)
    assert (stats.target_size, stats.servers, stats.placeholders) == (4, 3, 1)
    assert stats.creations_in_flight == 0
