"""A cloud API outage, as CA lives through it: the real server over mTLS gRPC, the emulator's
"down" fault (every /v1 request answers 503, or the connection is reset).

While the API is down: Refresh fails with UNAVAILABLE saying the API is unreachable, within
CA's deadline; TargetSize, NodeGroupForNode and NodeGroupNodes keep answering from the last
inventory; IncreaseSize fails (within the deadline) and leaves the target where it was.
When the API is back, everything converges without a restart.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from fixtures.stack import Stack, StackFactory, group, group_tags, wait_until

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

# CA's default timeout for every RPC; an answer later than this is no answer for CA.
CA_DEADLINE = 5.0
Code = grpc.StatusCode


async def rpc(method: Any, request: Any) -> tuple[Code, Any, str]:
    """(code, reply, details) of one call under CA's deadline."""
    try:
        reply = await method(request, timeout=CA_DEADLINE)
    except grpc.aio.AioRpcError as error:
        return error.code(), None, error.details() or ""
    return Code.OK, reply, ""


async def snapshot(s: Stack) -> dict[str, Any]:
    """Everything CA reads between Refreshes, as the server answers it."""
    size = await s.target("workers")
    instances = await s.instances("workers")
    owners = {}
    for instance in instances:
        request = pb.NodeGroupForNodeRequest(
            node=pb.ExternalGrpcNode(providerID=instance.id, name=instance.id)
        )
        code, reply, details = await rpc(s.stub.NodeGroupForNode, request)
        assert code == Code.OK, details
        owners[instance.id] = reply.nodeGroup.id
    return {
        "target": size,
        "instances": sorted((i.id, i.status.SerializeToString()) for i in instances),
        "owners": owners,
    }


async def arrange(s: Stack) -> None:
    """Three servers and one failed-creation placeholder, all known to the server."""
    await s.admin.populate(3, group_tags("workers"), zone="lpg1")
    await s.refresh()
    await s.admin.set_faults({"fail_next_creates": {"count": 1, "kind": "capacity"}})
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    await s.admin.clear_faults()
    await s.settle("workers")


@pytest.mark.parametrize("down", [True, "reset"], ids=["503", "connection-reset"])
async def test_outage_serves_the_last_inventory_and_recovers(
    stack: StackFactory, down: bool | str
) -> None:
    s = await stack([group("workers", 0, 10)])
    await arrange(s)
    before = await snapshot(s)
    assert before["target"] == 5
    assert set(before["owners"].values()) == {"workers"}

    await s.admin.set_faults({"down": down})

    code, _, details = await rpc(s.stub.Refresh, pb.RefreshRequest())
    assert code == Code.UNAVAILABLE, details
    assert "unreachable" in details.lower(), details

    assert await snapshot(s) == before

    code, _, details = await rpc(
        s.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2)
    )
    assert code == Code.UNAVAILABLE, details
    assert await snapshot(s) == before, "IncreaseSize during the outage changed the target"

    # A second Refresh and a TargetSize in the middle of the outage: still the same answers.
    code, _, _ = await rpc(s.stub.Refresh, pb.RefreshRequest())
    assert code == Code.UNAVAILABLE
    assert await snapshot(s) == before

    await s.admin.clear_faults()
    await converge(s, expected=5)
    # Scaling works again, without a restart.
    code, _, details = await rpc(
        s.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1)
    )
    assert code == Code.OK, details
    await converge(s, expected=6)


async def test_an_increase_after_a_refresh_that_gave_up_is_refused(stack: StackFactory) -> None:
    """A Refresh whose deadline ends while the client still retries the down API answers
    UNAVAILABLE and leaves the listing running; the IncreaseSize CA sends next is refused too
    (it was accepted while that listing had not yet failed for good, and its creates went
    into the outage: CI saw it when the retries' jitter outlasted CA's 5 s)."""
    s = await stack([group("workers", 0, 10)])
    await arrange(s)
    before = await snapshot(s)
    await s.admin.set_faults({"down": True})
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await s.stub.Refresh(pb.RefreshRequest(), timeout=0.5)  # gives up before the retries end
    assert refused.value.code() == Code.UNAVAILABLE
    code, _, details = await rpc(
        s.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2)
    )
    assert code == Code.UNAVAILABLE, details
    assert "unreachable" in details, details
    assert await snapshot(s) == before, "IncreaseSize during the outage changed the target"
    await s.admin.clear_faults()
    await converge(s, expected=5)


async def converge(s: Stack, expected: int) -> None:
    """Refresh until the server's view equals the cloud: target = servers + placeholders."""

    async def agrees() -> bool:
        code, _, _ = await rpc(s.stub.Refresh, pb.RefreshRequest())
        if code != Code.OK:
            return False
        instances = await s.instances("workers")
        placeholders = [i for i in instances if i.id.startswith("cloudscale://failed-")]
        servers = {i.id.removeprefix("cloudscale://") for i in instances} - {
            i.id.removeprefix("cloudscale://") for i in placeholders
        }
        cloud = {srv["uuid"] for srv in await s.cloud_servers("workers")}
        size = await s.target("workers")
        return servers == cloud and size == len(cloud) + len(placeholders) == expected

    await wait_until(agrees, 30, f"the server's view did not converge on {expected}")


async def test_outage_with_creations_in_flight_converges(stack: StackFactory) -> None:
    """The API goes down while creations are in flight (slow creates): they fail or finish;
    when it returns, target and cloud agree and no creation is left in flight. One whose
    outcome stayed unknown is counted until listed or 2 x timeoutSeconds (6 s here) pass."""
    s = await stack([group("workers", 0, 10)], cloudscale={"timeout_seconds": 3.0})
    await s.refresh()
    await s.admin.set_faults({"latency": {"create_server": {"fixed_ms": 2500}}})
    code, _, details = await rpc(
        s.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id="workers", delta=3)
    )
    assert code == Code.OK, details  # returned with the creations still in flight
    await s.admin.set_faults({"down": True})
    code, _, _ = await rpc(s.stub.Refresh, pb.RefreshRequest())
    assert code == Code.UNAVAILABLE
    assert await s.target("workers") == 3  # still counted: in flight or failed placeholders
    await s.admin.clear_faults()

    async def nothing_in_flight() -> bool:
        await s.refresh()
        return not any(g.creations_in_flight for g in s.provider.service.engine.group_stats())

    await wait_until(nothing_in_flight, 30, "creations still in flight after the outage")
    instances = await s.instances("workers")
    placeholders = [i for i in instances if i.id.startswith("cloudscale://failed-")]
    cloud = await s.cloud_servers("workers")
    assert await s.target("workers") == len(cloud) + len(placeholders) == 3


async def test_throttled_api_refresh_answers_within_the_deadline(stack: StackFactory) -> None:
    """Every listing answered 429 with Retry-After: 1 (a throttling storm): Refresh must
    still answer, UNAVAILABLE, before CA's 5 s deadline runs out, not leave CA to time out.
    The previous inventory keeps being served."""
    s = await stack([group("workers", 0, 10)])
    await s.admin.populate(2, group_tags("workers"), zone="lpg1")
    await s.refresh()
    await s.admin.set_faults({"rate_limit": {"list_servers": {"rate": 1.0, "retry_after": 1}}})
    code, _, details = await rpc(s.stub.Refresh, pb.RefreshRequest())
    assert code == Code.UNAVAILABLE, f"{code.name}: {details}"
    assert await s.target("workers") == 2
