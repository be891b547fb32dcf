"""The read-side RPCs over mTLS against the emulator: NodeGroupForNode, TemplateNodeInfo,
GetOptions, GPU RPCs, pricing, NodeGroups."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from fixtures.stack import StackFactory, group, group_tags, wait_until
from google.protobuf import duration_pb2

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.protos.k8s.apimachinery import meta_v1_pb2
from cloudscale_autoscaler.settings.types import AutoscalingOptions

GPU_FLAVOR = "gpu2-128-16-1-200"


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_node_group_for_node_every_providerid_form(stack: StackFactory) -> None:
    s = await stack([group("workers", 1, 7), group("other", 0, 3)])
    [worker] = await s.admin.populate(1, group_tags("workers"))
    [other] = await s.admin.populate(1, group_tags("other"))
    [unconfigured] = await s.admin.populate(1, group_tags("not-configured"))
    [untagged] = await s.admin.populate(1, {})
    await s.refresh()

    async def ask(provider_id: str) -> pb.NodeGroup:
        node = pb.ExternalGrpcNode(providerID=provider_id, name="n")
        reply = await s.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node))
        answer: pb.NodeGroup = reply.nodeGroup
        return answer

    bare = worker.replace("-", "")
    for form in (
        f"cloudscale://{worker}",
        f"cloudscale://{worker.upper()}",
        f"CLOUDSCALE://{worker}",
        f"cloudscale://{bare}",
        f"cloudscale://{bare.upper()}",
    ):
        got = await ask(form)
        assert (got.id, got.minSize, got.maxSize) == ("workers", 1, 7), form
    got = await ask(f"cloudscale://{other}")
    assert (got.id, got.minSize, got.maxSize) == ("other", 0, 3)
    for form in (
        "",
        f"aws:///{worker}",
        worker,
        f"cloudscale://{unconfigured}",
        f"cloudscale://{untagged}",
        "cloudscale://00000000-0000-4000-8000-000000000000",
        "cloudscale://garbage",
    ):
        assert (await ask(form)).id == "", form


async def test_node_group_for_node_knows_new_servers_and_placeholders(
    stack: StackFactory,
) -> None:
    s = await stack([group("workers", 0, 5)])
    await s.admin.set_faults({"fail_next_creates": {"count": 1, "kind": "capacity"}})
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    await s.settle("workers")
    instances = (await s.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="workers"))).instances
    assert len(instances) == 2
    for instance in instances:
        node = pb.ExternalGrpcNode(providerID=instance.id, name=instance.id)
        reply = await s.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node))
        assert reply.nodeGroup.id == "workers"


async def test_template_node_info_both_fields_identical(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 5, labels=(("role", "worker"),))])
    request = pb.NodeGroupTemplateNodeInfoRequest(id="workers")
    reply = await s.stub.NodeGroupTemplateNodeInfo(request)
    assert reply.nodeBytes
    assert core_v1_pb2.Node.FromString(reply.nodeBytes) == reply.nodeInfo
    assert reply.nodeInfo.SerializeToString(deterministic=True) == reply.nodeBytes
    node = reply.nodeInfo
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "flex-4-2"
    assert node.metadata.labels["role"] == "worker"
    assert node.status.allocatable["pods"].string
    # Deterministic: the same bytes again, also after a Refresh rebuilt the cache.
    await s.refresh()
    assert (await s.stub.NodeGroupTemplateNodeInfo(request)).nodeBytes == reply.nodeBytes


async def test_template_node_info_errors(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 5, flavor="flex-999-1")])
    error = await rpc_error(
        s.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id="workers"))
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "flex-999-1" in (error.details() or "")
    error = await rpc_error(
        s.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id="nope"))
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


# CA's externalgrpc client gives every call this long.
CA_DEADLINE_SECONDS = 5.0


@pytest.mark.parametrize("latency_ms", [0, 3000], ids=["503", "slow-503"])
async def test_calls_read_the_slug_at_once_without_flavors(
    stack: StackFactory, latency_ms: int
) -> None:
    """The flavors endpoint answers 503, which the client retries with backoff (and slowly
    with latency): every call still answers within CA's deadline, from the flavor slugs."""
    s = await stack([group("workers", 0, 5), group("odd", 0, 5, flavor="custom-large")])
    request = pb.NodeGroupTemplateNodeInfoRequest(id="workers")
    deadline = CA_DEADLINE_SECONDS
    cached = await s.stub.NodeGroupTemplateNodeInfo(request, timeout=deadline)
    faults: dict[str, Any] = {"error_rate": {"list_flavors": {"rate": 1.0, "status": 503}}}
    if latency_ms:
        faults["latency"] = {"list_flavors": {"fixed_ms": latency_ms}}
    await s.admin.set_faults(faults)
    await s.stub.Refresh(pb.RefreshRequest(), timeout=deadline)
    assert (await s.stub.NodeGroupTemplateNodeInfo(request, timeout=deadline)) == cached
    # A new process that never saw the flavors reads the size from the slug: the same Node,
    # on every call after a Refresh whose flavor fetch failed, and IncreaseSize goes ahead.
    s2 = await s.restart()
    await s2.stub.Refresh(pb.RefreshRequest(), timeout=deadline)
    for _ in range(2):
        assert (await s2.stub.NodeGroupTemplateNodeInfo(request, timeout=deadline)) == cached
    increase = pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1)
    await s2.stub.NodeGroupIncreaseSize(increase, timeout=deadline)
    await s2.stub.NodeGroupIncreaseSize(increase, timeout=deadline)
    assert await s2.target("workers") == 2
    # A slug that says nothing: FAILED_PRECONDITION naming it, never an empty template.
    odd = pb.NodeGroupTemplateNodeInfoRequest(id="odd")
    error = await rpc_error(s2.stub.NodeGroupTemplateNodeInfo(odd, timeout=deadline))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "custom-large" in (error.details() or "")


async def test_a_slow_flavor_fetch_is_picked_up_without_a_refresh(stack: StackFactory) -> None:
    """A first flavor fetch slower than the catalog waits (a cold connection) is no failure: once
    it has arrived in the background, the next call has the list, without another Refresh."""
    s = await stack([group("gpus", 0, 2, flavor=GPU_FLAVOR, zone=None)])
    # A new process, so its client has no flavors cached: the load at its start (its first
    # Refresh) gives up on the flavor fetch, held 1.5 s, after FLAVOR_WAIT_SECONDS.
    await s.admin.set_faults({"latency": {"list_flavors": {"fixed_ms": 1500}}})
    s2 = await s.restart()
    # Later requests are answered at once; the held one stays held to its end.
    await s2.admin.set_faults({"latency": {"list_flavors": {"fixed_ms": 0}}})

    async def fetched() -> bool:
        return not (await s2.cloud_in_flight()).get("list_flavors")

    await wait_until(fetched, 30, "the held flavor fetch did not end")
    request = pb.GetAvailableGPUTypesRequest()
    types = await s2.stub.GetAvailableGPUTypes(request, timeout=CA_DEADLINE_SECONDS)
    assert list(types.gpuTypes) == ["nvidia-rtx-pro-6000-max-q"]


async def test_get_options_both_generations(stack: StackFactory) -> None:
    overrides = AutoscalingOptions(
        scale_down_utilization_threshold=0.3,
        scale_down_unneeded_seconds=120,
        max_node_startup_seconds=600,
        zero_or_max_node_scaling=True,
    )
    s = await stack([group("workers", 0, 5, autoscaling_options=overrides), group("plain")])
    defaults = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5,
        scaleDownGpuUtilizationThreshold=0.6,
        scaleDownUnreadyDuration=duration_pb2.Duration(seconds=1200),
        MaxNodeProvisionTime=meta_v1_pb2.Duration(duration=900 * 10**9),
        ignoreDaemonSetsUtilization=True,
    )
    reply = await s.stub.NodeGroupGetOptions(
        pb.NodeGroupAutoscalingOptionsRequest(id="workers", defaults=defaults)
    )
    got = reply.nodeGroupAutoscalingOptions
    assert got.scaleDownUtilizationThreshold == pytest.approx(0.3)
    assert got.scaleDownGpuUtilizationThreshold == pytest.approx(0.6)
    assert got.zeroOrMaxNodeScaling and got.ignoreDaemonSetsUtilization
    pairs = [
        (got.scaleDownUnneededTime, got.scaleDownUnneededDuration, 120),
        (got.scaleDownUnreadyTime, got.scaleDownUnreadyDuration, 1200),
        (got.MaxNodeProvisionTime, got.MaxNodeProvisionDuration, 900),
    ]
    for old, new, seconds in pairs:
        assert old.duration == seconds * 10**9
        assert (new.seconds, new.nanos) == (seconds, 0)
    assert got.maxNodeStartupDuration.seconds == 600

    for group_id, code, text in [
        ("plain", grpc.StatusCode.UNIMPLEMENTED, "plain"),
        ("nope", grpc.StatusCode.NOT_FOUND, "nope"),
    ]:
        error = await rpc_error(
            s.stub.NodeGroupGetOptions(
                pb.NodeGroupAutoscalingOptionsRequest(id=group_id, defaults=defaults)
            )
        )
        assert error.code() == code
        assert text in (error.details() or "")


async def test_gpu_rpcs(stack: StackFactory) -> None:
    s = await stack(
        [group("workers"), group("gpus", 0, 2, flavor=GPU_FLAVOR, zone=None)],
        gpu_label="example.com/gpu",
    )
    label = await s.stub.GPULabel(pb.GPULabelRequest())
    assert label.label == "example.com/gpu"
    types = await s.stub.GetAvailableGPUTypes(pb.GetAvailableGPUTypesRequest())
    assert list(types.gpuTypes) == ["nvidia-rtx-pro-6000-max-q"]
    # The template carries the same value under the GPU label, so CA can match the two.
    template = await s.stub.NodeGroupTemplateNodeInfo(
        pb.NodeGroupTemplateNodeInfoRequest(id="gpus")
    )
    assert template.nodeInfo.metadata.labels["example.com/gpu"] in types.gpuTypes


async def test_gpu_types_without_gpu_groups_is_empty(stack: StackFactory) -> None:
    s = await stack([group("workers")])
    types = await s.stub.GetAvailableGPUTypes(pb.GetAvailableGPUTypesRequest())
    assert dict(types.gpuTypes) == {}


async def test_pricing_unimplemented_and_node_groups(stack: StackFactory) -> None:
    s = await stack([group("workers", 1, 4), group("other", 0, 2)])
    for name, call in [
        ("PricingNodePrice", s.stub.PricingNodePrice(pb.PricingNodePriceRequest())),
        ("PricingPodPrice", s.stub.PricingPodPrice(pb.PricingPodPriceRequest())),
    ]:
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert name in (error.details() or "")
    groups = (await s.stub.NodeGroups(pb.NodeGroupsRequest())).nodeGroups
    assert [(g.id, g.minSize, g.maxSize) for g in groups] == [("workers", 1, 4), ("other", 0, 2)]
    await s.stub.Cleanup(pb.CleanupRequest())


async def test_target_size_unknown_group(stack: StackFactory) -> None:
    s = await stack([group("workers")])
    error = await rpc_error(s.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="x")))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = await rpc_error(s.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="x")))
    assert error.code() == grpc.StatusCode.NOT_FOUND
