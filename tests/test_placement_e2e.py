"""antiAffinity end to end: the real server over mTLS gRPC, CA's calls, the emulator's
server groups over real HTTP. Server groups fill up to four before the next is made, concurrent
scale-ups never overfill one, a new process finds its own again, the empty ones it made go (and
never one it did not make), and the API's refusals reach CA as failed instances of their class.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fixtures.stack import CLUSTER, Stack, StackFactory, group, group_tags

from cloudscale_autoscaler.cloud.models import TAG_MANAGED
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

ANTI_AFFINE = group("workers", 0, 10, anti_affinity=True, zone="lpg1")
MANAGED = {**group_tags("workers"), TAG_MANAGED: "true"}
OUT_OF_RESOURCES, OTHER = 1, 99


async def increase(s: Stack, delta: int) -> None:
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=delta))


async def managed(s: Stack) -> list[dict[str, Any]]:
    """Our server groups: both identity tags and the managed tag."""
    return [
        g
        for g in await s.admin.server_groups()
        if all(g["tags"].get(k) == v for k, v in MANAGED.items())
    ]


async def members(s: Stack) -> list[int]:
    return sorted(len(g["servers"]) for g in await managed(s))


async def failed(s: Stack) -> list[pb.InstanceErrorInfo]:
    return [
        i.status.errorInfo for i in await s.instances("workers") if i.status.errorInfo.errorCode
    ]


async def test_six_servers_fill_a_group_of_four_then_a_new_one(stack: StackFactory) -> None:
    s = await stack([ANTI_AFFINE])
    await s.refresh()
    await increase(s, 6)
    await s.settle("workers")
    assert await members(s) == [2, 4]
    groups = await managed(s)
    assert {g["zone"]["slug"] for g in groups} == {"lpg1"}
    assert all(g["name"].startswith(f"{CLUSTER}-workers-") for g in groups)
    servers = {srv["uuid"] for srv in await s.cloud_servers("workers")}
    assert {m["uuid"] for g in groups for m in g["servers"]} == servers
    # What /metrics (..._node_group_server_groups) and /status (server_groups) show.
    (stats,) = s.provider.service.engine.group_stats()
    (status,) = s.provider.service.engine.group_statuses()
    assert stats.server_groups == status.server_groups == 2


async def test_concurrent_scale_ups_never_overfill_a_group(stack: StackFactory) -> None:
    s = await stack([ANTI_AFFINE])
    await s.refresh()
    await asyncio.gather(*(increase(s, 1) for _ in range(5)))
    await s.settle("workers")
    assert await failed(s) == []
    assert await members(s) == [1, 4]


async def test_a_new_process_fills_the_groups_it_finds(stack: StackFactory) -> None:
    s = await stack([ANTI_AFFINE])
    await s.refresh()
    await increase(s, 2)
    await s.settle("workers")
    s = await s.restart()
    await s.refresh()
    await increase(s, 2)
    await s.settle("workers")
    assert await members(s) == [4]


async def test_at_zero_the_groups_it_made_go_and_no_other(stack: StackFactory) -> None:
    # Empty groups go after 2 x timeoutSeconds (a create of unknown outcome may still join).
    s = await stack([ANTI_AFFINE], cloudscale={"timeout_seconds": 2.0})
    # Tagged for this cluster and group, but not made by the provider: never deleted.
    foreign = await s.admin.create_server_group("hand-made", "lpg1", group_tags("workers"))
    await s.refresh()
    await increase(s, 5)
    await s.settle("workers")
    assert await members(s) == [1, 4]
    nodes = [pb.ExternalGrpcNode(providerID=f"cloudscale://{srv['uuid']}", name=srv["name"])
             for srv in await s.cloud_servers("workers")]  # fmt: skip
    await s.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="workers", nodes=nodes))
    await s.settle("workers")

    async def none_left() -> bool:
        await s.refresh()  # the listing after the servers went deletes the empty groups
        return await managed(s) == []

    await wait_for_true(none_left)
    assert foreign["uuid"] in {g["uuid"] for g in await s.admin.server_groups()}


async def wait_for_true(condition: Any, limit: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not await condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_no_distinct_host_is_out_of_resources(stack: StackFactory) -> None:
    s = await stack([ANTI_AFFINE])
    await s.admin.set_faults({"host_shortage": {"zones": ["lpg1"]}})
    await s.refresh()
    await increase(s, 1)  # resource refusals never fail the RPC, even within the wait
    await wait_for_true(lambda: _codes(s, {"NO_DISTINCT_HOST"}))
    (info,) = await failed(s)
    assert (info.errorCode, info.instanceErrorClass) == ("NO_DISTINCT_HOST", OUT_OF_RESOURCES)
    assert "No distinct host available in zone lpg1" in info.errorMessage


async def test_a_group_filled_or_deleted_behind_our_back_fails_the_create_as_other(
    stack: StackFactory,
) -> None:
    s = await stack([ANTI_AFFINE], increase_size_wait_seconds=0.0)
    await s.refresh()
    await increase(s, 2)
    await s.settle("workers")
    (known,) = await managed(s)
    # Filled to the limit by someone else, unknown to the provider until its next listing.
    for i in range(2):
        await s.admin.create_server(f"other-{i}", zone="lpg1", server_groups=[known["uuid"]])
    await increase(s, 1)
    await wait_for_true(lambda: _codes(s, {"SERVER_GROUP_FULL"}))
    assert [i.instanceErrorClass for i in await failed(s)] == [OTHER]


async def _codes(s: Stack, wanted: set[str]) -> bool:
    return {info.errorCode for info in await failed(s)} == wanted


async def test_a_listing_never_deletes_a_group_a_listed_server_joined(stack: StackFactory) -> None:
    """A Refresh whose server listing answers after a create joined a new server group: the
    server groups are listed after the servers, so that group is seen with its member and
    kept (listed beside them, the groups' older answer showed it empty and it was deleted)."""
    s = await stack([ANTI_AFFINE])
    await s.refresh()
    await s.admin.set_faults({"latency": {"create_server": {"fixed_ms": 1000},
                                          "list_servers": {"fixed_ms": 2000}}})  # fmt: skip
    await increase(s, 1)  # the server group is made at once, its server joins in 1 s
    await asyncio.sleep(0.3)
    await s.refresh()  # the servers are listed at 2 s, with the new one as a member
    await s.admin.clear_faults()
    await s.settle("workers")
    assert (await s.admin.stats()).get("delete_server_group", {}) == {}
    assert await members(s) == [1]
