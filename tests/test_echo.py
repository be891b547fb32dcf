"""Client-supplied values are echoed bounded: a 3 MB group id or node name gets its NOT_FOUND
or FAILED_PRECONDITION with a short message naming it (start and length), over real mTLS
gRPC, and the log stays short too."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

import grpc
import pytest
from fixtures.stack import StackFactory, group

from cloudscale_autoscaler.observability.echo import ECHO_LIMIT, clip
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.settings.types import PricingConfig

HUGE = 3 * 1024 * 1024  # 3145728 characters: far past gRPC's status and metadata limits
SHORT = 1000  # any bounded message is well below this


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", ""),
        ("workers", "workers"),
        ("x" * ECHO_LIMIT, "x" * ECHO_LIMIT),
        ("x" * (ECHO_LIMIT + 1), "x" * ECHO_LIMIT + f"… ({ECHO_LIMIT + 1} characters)"),
        ("é" * HUGE, "é" * ECHO_LIMIT + f"… ({HUGE} characters)"),
    ],
)
def test_clip(value: str, expected: str) -> None:
    assert clip(value) == expected


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def huge_id() -> str:
    return "g" * HUGE


async def test_a_huge_group_id_gets_not_found_with_a_short_message(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    s = await stack([group("workers", 0, 3)])
    name = huge_id()
    node = pb.ExternalGrpcNode(providerID="cloudscale://x", name="n")
    calls = {
        "NodeGroupTargetSize": s.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=name)),
        "NodeGroupNodes": s.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=name)),
        "NodeGroupIncreaseSize": s.stub.NodeGroupIncreaseSize(
            pb.NodeGroupIncreaseSizeRequest(id=name, delta=1)
        ),
        "NodeGroupDecreaseTargetSize": s.stub.NodeGroupDecreaseTargetSize(
            pb.NodeGroupDecreaseTargetSizeRequest(id=name, delta=-1)
        ),
        "NodeGroupDeleteNodes": s.stub.NodeGroupDeleteNodes(
            pb.NodeGroupDeleteNodesRequest(id=name, nodes=[node])
        ),
        "NodeGroupTemplateNodeInfo": s.stub.NodeGroupTemplateNodeInfo(
            pb.NodeGroupTemplateNodeInfoRequest(id=name)
        ),
        "NodeGroupGetOptions": s.stub.NodeGroupGetOptions(
            pb.NodeGroupAutoscalingOptionsRequest(id=name)
        ),
    }
    for rpc, call in calls.items():
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND, (rpc, error.code())
        message = error.details() or ""
        assert len(message) < SHORT, rpc
        assert f"'{'g' * ECHO_LIMIT}… ({HUGE} characters)'" in message, rpc
        assert "(configured: workers)" in message, rpc
    assert max(len(r.getMessage()) for r in caplog.records) < SHORT


async def test_a_huge_node_name_and_provider_id_are_echoed_short(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    s = await stack([group("workers", 0, 3)])
    nodes = {
        "foreign providerID": pb.ExternalGrpcNode(
            providerID="aws://" + "p" * HUGE, name="n" * HUGE
        ),
        "placeholder": pb.ExternalGrpcNode(providerID="cloudscale://failed-" + "f" * HUGE),
        "name only": pb.ExternalGrpcNode(name="n" * HUGE),
    }
    for case, node in nodes.items():
        request = pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node])
        error = await rpc_error(s.stub.NodeGroupDeleteNodes(request))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, (case, error.code())
        message = error.details() or ""
        assert len(message) < 2 * SHORT, case
        assert f"… ({HUGE} characters)" in message, case
    assert max(len(r.getMessage()) for r in caplog.records) < 2 * SHORT


PRICING = PricingConfig(currency="CHF", flavors=(("flex-4-2", Decimal("0.05")),))


async def test_pricing_echoes_a_huge_node_and_pod_short(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 3)], pricing=PRICING)
    node = pb.ExternalGrpcNode(
        name="n" * HUGE,
        providerID="aws://" + "p" * HUGE,
        labels={"node.kubernetes.io/instance-type": "f" * HUGE},
    )
    request = pb.PricingNodePriceRequest(node=node)
    request.startTime.seconds, request.endTime.seconds = 0, 3600
    error = await rpc_error(s.stub.PricingNodePrice(request))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    message = error.details() or ""
    assert len(message) < 2 * SHORT and message.count(f"({HUGE + 6} characters)") == 1

    pod = core_v1_pb2.Pod()
    pod.metadata.name = "q" * HUGE
    container = pod.spec.containers.add()
    container.resources.requests["cpu"].string = "x" * HUGE
    pod_request = pb.PricingPodPriceRequest(pod=pod)
    pod_request.startTime.seconds, pod_request.endTime.seconds = 0, 3600
    error = await rpc_error(s.stub.PricingPodPrice(pod_request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = error.details() or ""
    assert len(message) < 2 * SHORT and f"… ({HUGE} characters)" in message
