"""The answers the transport serves by itself (NodeGroups, GPULabel, NodeGroupForNode,
NodeGroupTargetSize, NodeGroupGetOptions, NodeGroupTemplateNodeInfo): served without Python's
event loop, and always exactly what the servicer answers, right after every change (CA calls
one at a time)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import Any

import grpc
import pytest
from fixtures.stack import Stack, StackFactory, group, group_tags, wait_until
from fixtures.tls import PKI, StandInServicer, address, make_config

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.settings.types import AutoscalingOptions, Taint
from cloudscale_autoscaler.transport.server import start_server

TIMEOUT = 10.0
TUNED = AutoscalingOptions(
    scale_down_utilization_threshold=0.4,
    scale_down_gpu_utilization_threshold=0.5,
    scale_down_unneeded_seconds=600,
    scale_down_unready_seconds=1200,
    max_node_provision_seconds=900,
    max_node_startup_seconds=300,
    zero_or_max_node_scaling=False,
    ignore_daemonsets_utilization=True,
    allow_non_atomic_scale_up_to_max=False,
)
# What CA 1.36 sends: its defaults, with the new duration fields.
CA_DEFAULTS = pb.NodeGroupAutoscalingOptions(scaleDownUtilizationThreshold=0.5)


def sync_stub(pki: PKI, address: str) -> tuple[grpc.Channel, pb_grpc.CloudProviderStub]:
    credentials = grpc.ssl_channel_credentials(
        pki.ca_cert.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
    )
    channel = grpc.secure_channel(address, credentials)
    return channel, pb_grpc.CloudProviderStub(channel)  # type: ignore[no-untyped-call]


async def two_groups(stack: StackFactory) -> tuple[Stack, list[str]]:
    s = await stack(
        groups=[group("workers", 0, 5), group("tuned", 0, 3, autoscaling_options=TUNED)]
    )
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    await s.settle("workers")
    ids = [i.id for i in await s.instances("workers")]
    assert len(ids) == 2
    return s, ids


def hot_calls(stub: pb_grpc.CloudProviderStub, provider_id: str) -> list[Any]:
    node = pb.ExternalGrpcNode(providerID=provider_id)
    return [
        stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT),
        stub.GPULabel(pb.GPULabelRequest(), timeout=TIMEOUT),
        stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=TIMEOUT),
        stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="workers"), timeout=TIMEOUT),
        stub.NodeGroupGetOptions(
            pb.NodeGroupAutoscalingOptionsRequest(id="tuned", defaults=CA_DEFAULTS),
            timeout=TIMEOUT,
        ),
        stub.NodeGroupTemplateNodeInfo(
            pb.NodeGroupTemplateNodeInfoRequest(id="workers"), timeout=TIMEOUT
        ),
    ]


async def test_hot_rpcs_are_answered_while_the_event_loop_is_blocked(
    stack: StackFactory, pki: PKI
) -> None:
    s, ids = await two_groups(stack)
    await s.refresh()  # builds the templates, as CA's first Refresh does
    channel, stub = sync_stub(pki, s.address)
    answers: list[Any] = []
    forwarded: list[grpc.StatusCode] = []

    def client() -> None:
        answers.extend(hot_calls(stub, ids[0]))
        try:  # Control: a forwarded call needs the loop, so it cannot finish now.
            stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="workers"), timeout=0.5)
        except grpc.RpcError as error:
            forwarded.append(error.code())  # type: ignore[attr-defined]

    with channel:
        thread = threading.Thread(target=client)
        thread.start()
        # Block the event loop (a join without await) until the client is done, or give up.
        thread.join(timeout=20)
        alive = thread.is_alive()
        thread.join()
    assert not alive, "hot RPCs waited for the event loop"
    assert forwarded == [grpc.StatusCode.DEADLINE_EXCEEDED]
    groups, label, for_node, target, options, template = answers
    assert [g.id for g in groups.nodeGroups] == ["workers", "tuned"]
    assert label.label == "cloudscale.ch/gpu"
    assert for_node.nodeGroup.id == "workers"
    assert target.targetSize == 2
    assert options.nodeGroupAutoscalingOptions.scaleDownUtilizationThreshold == 0.4
    assert template.nodeInfo.status.capacity["cpu"].string == "2"  # flex-4-2


async def test_a_mutating_call_cut_off_at_its_deadline_is_seen_by_the_next_hot_read(
    stack: StackFactory, pki: PKI
) -> None:
    # The transport answers DEADLINE_EXCEEDED on time even when the event loop is late; the
    # IncreaseSize it gave up on has already raised the target, but Python publishes only
    # when that call ends. CA's next TargetSize must not get the target from before.
    s = await stack(groups=[group("workers", 0, 5)], increase_size_wait_seconds=30.0)
    await s.admin.set_faults({"latency": {"create_server": {"fixed_ms": 30000}}})
    engine = s.provider.service.engine
    channel, stub = sync_stub(pki, s.address)
    outcomes: list[Any] = []

    def client() -> None:
        request = pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1)
        try:
            stub.NodeGroupIncreaseSize(request, timeout=1.0)
        except grpc.RpcError as error:
            outcomes.append(error.code())  # type: ignore[attr-defined]
        target = pb.NodeGroupTargetSizeRequest(id="workers")
        outcomes.append(stub.NodeGroupTargetSize(target, timeout=TIMEOUT).targetSize)

    with channel:
        thread = threading.Thread(target=client)
        thread.start()

        async def raised() -> bool:
            return engine.settled_targets().get("workers") == 1 or not thread.is_alive()

        await wait_until(raised, 5.0, "IncreaseSize did not raise the target")
        # The loop is late past the call's deadline (and past the servicer's own margin).
        time.sleep(1.5)  # noqa: ASYNC251 (blocking the event loop is the point)
        await asyncio.to_thread(thread.join, 20)
    assert outcomes == [grpc.StatusCode.DEADLINE_EXCEEDED, 1]
    await s.admin.set_faults({})


class _NoDeadline:
    def time_remaining(self) -> None:
        return None

    async def abort(self, code: grpc.StatusCode, details: str) -> Any:
        raise AssertionError(f"{code}: {details}")


async def test_node_group_for_node_answers_every_spelling_as_the_engine_does(
    stack: StackFactory,
) -> None:
    s, ids = await two_groups(stack)
    uuid = ids[0].removeprefix("cloudscale://")
    spellings = [
        ids[0],
        ids[0].upper(),
        "CloudScale://" + uuid.replace("-", ""),
        "cloudscale://" + uuid.upper().replace("-", ""),
        "cloudscale://" + uuid[:-1],  # one digit short
        "cloudscale://" + uuid[:-1] + "g",  # not hex
        "cloudscale://" + uuid.replace("-", "+"),
        "cloudscale://00000000-0000-4000-8000-000000000000",  # nobody's
        "cloudscale://failed-nothing",
        "aws:///eu-west-1a/i-0123",
        "",
        "cloudscale://",
        "clöudscale://" + uuid,
    ]
    engine = s.provider.service.engine
    for provider_id in spellings:
        request = pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(providerID=provider_id))
        served = await s.stub.NodeGroupForNode(request, timeout=TIMEOUT)
        assert served == engine.node_group_for_node(provider_id), provider_id
    for provider_id in spellings[:4]:  # the spellings of our server do hit
        request = pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(providerID=provider_id))
        assert (await s.stub.NodeGroupForNode(request)).nodeGroup.id == "workers"


async def test_answers_follow_every_change_at_once(stack: StackFactory) -> None:
    s, ids = await two_groups(stack)
    service = s.provider.service

    async def direct_target(group_id: str) -> int:
        request = pb.NodeGroupTargetSizeRequest(id=group_id)
        reply = await service.NodeGroupTargetSize(request, _NoDeadline())
        return int(reply.targetSize)

    # Each read comes right after the call that changed the state, as CA makes them.
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=3))
    assert await s.target("workers") == 5 == await direct_target("workers")
    await s.stub.NodeGroupDeleteNodes(
        pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[pb.ExternalGrpcNode(providerID=ids[0])])
    )
    assert await s.target("workers") == 4 == await direct_target("workers")
    await s.settle("workers")
    instances = await s.instances("workers")
    assert await s.target("workers") == len(instances) == 4
    # A server created in the background is found as soon as it is listed.
    for instance in instances:
        request = pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(providerID=instance.id))
        assert (await s.stub.NodeGroupForNode(request)).nodeGroup.id == "workers"
    # A server tagged for the group by hand counts from the Refresh that lists it on.
    manual = await s.admin.create_server("by-hand", tags=group_tags("workers"))
    manual_id = pb.ExternalGrpcNode(providerID=f"cloudscale://{manual['uuid']}")
    await s.refresh()
    assert await s.target("workers") == 5
    reply = await s.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=manual_id))
    assert reply.nodeGroup.id == "workers"
    # An unknown group is a miss: the servicer's NOT_FOUND, with its message.
    try:
        await s.target("nope")
        raise AssertionError("no error for an unknown group")
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "'nope'" in (error.details() or "")


async def test_a_failed_publish_withdraws_the_answers_it_could_not_refresh(
    stack: StackFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s, ids = await two_groups(stack)
    engine = s.provider.service.engine
    settled_targets = engine.settled_targets
    failing = [True]

    def fails_while_failing() -> dict[str, int]:
        if failing[0]:
            raise RuntimeError("injected publishing failure")
        return settled_targets()

    monkeypatch.setattr(engine, "settled_targets", fails_while_failing)
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1))
    assert "injected publishing failure" in caplog.text
    # Not the target published before the call (2): the servicer answers.
    assert await s.target("workers") == 3
    node = pb.ExternalGrpcNode(providerID=ids[0])
    reply = await s.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node))
    assert reply.nodeGroup.id == "workers"
    # The next publish succeeds and publishes everything again.
    failing[0] = False
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1))
    assert await s.target("workers") == 4


async def test_target_drops_when_the_deletion_tag_lands_while_the_delete_is_held(
    stack: StackFactory,
) -> None:
    s, ids = await two_groups(stack)
    # The tag lands after DeleteNodes gave up (its caller's deadline); the DELETE is held long
    # after that. Nothing else is forwarded meanwhile: only TargetSize, which is hot.
    await s.admin.set_faults(
        {"latency": {"patch_server": {"fixed_ms": 2500}, "delete_server": {"fixed_ms": 10000}}}
    )
    request = pb.NodeGroupDeleteNodesRequest(
        id="workers", nodes=[pb.ExternalGrpcNode(providerID=ids[0])]
    )
    with contextlib.suppress(grpc.aio.AioRpcError):
        await s.stub.NodeGroupDeleteNodes(request, timeout=1.0)

    async def lowered() -> bool:
        return await s.target("workers") == 1

    await wait_until(lowered, 8.0, "TargetSize kept the server whose deletion was requested")
    assert (await s.cloud_in_flight()).get("delete_server") == 1  # the DELETE is still held
    assert len(await s.cloud_servers("workers")) == 2


async def test_get_options_without_overrides_is_unimplemented_with_the_engine_message(
    stack: StackFactory,
) -> None:
    s = await stack(groups=[group("workers", 0, 5)])
    request = pb.NodeGroupAutoscalingOptionsRequest(id="workers", defaults=CA_DEFAULTS)
    for _ in range(2):
        try:
            await s.stub.NodeGroupGetOptions(request, timeout=TIMEOUT)
            raise AssertionError("GetOptions answered for a group without options")
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.UNIMPLEMENTED
            assert error.details() == (
                "node group workers has no autoscalingOptions: CA's defaults apply"
            )


async def test_get_options_depending_on_defaults_is_kept_per_request(
    stack: StackFactory, pki: PKI
) -> None:
    """Only some options set: the answer takes the rest from the defaults CA sends. The first
    request of each kind is Python's answer; the same bytes again are served with the loop
    blocked, and other defaults still get their own answer."""
    partial = AutoscalingOptions(scale_down_utilization_threshold=0.4)
    s = await stack(groups=[group("partial", 0, 3, autoscaling_options=partial)])
    ca_134 = pb.NodeGroupAutoscalingOptions(scaleDownGpuUtilizationThreshold=0.7)
    ca_136 = pb.NodeGroupAutoscalingOptions(scaleDownGpuUtilizationThreshold=0.9)

    def request(defaults: pb.NodeGroupAutoscalingOptions) -> Any:
        return pb.NodeGroupAutoscalingOptionsRequest(id="partial", defaults=defaults)

    first = await s.stub.NodeGroupGetOptions(request(ca_136), timeout=TIMEOUT)
    channel, stub = sync_stub(pki, s.address)
    answers: list[Any] = []
    with channel:
        thread = threading.Thread(
            target=lambda: answers.append(stub.NodeGroupGetOptions(request(ca_136), timeout=5))
        )
        thread.start()
        thread.join(timeout=20)  # the event loop is blocked meanwhile
        alive = thread.is_alive()
        thread.join()
    assert not alive, "a repeated GetOptions waited for the event loop"
    assert answers == [first]
    assert first.nodeGroupAutoscalingOptions.scaleDownGpuUtilizationThreshold == 0.9
    other = await s.stub.NodeGroupGetOptions(request(ca_134), timeout=TIMEOUT)
    assert other.nodeGroupAutoscalingOptions.scaleDownGpuUtilizationThreshold == 0.7
    assert other.nodeGroupAutoscalingOptions.scaleDownUtilizationThreshold == 0.4


def _answered_with_loop_blocked(stub: pb_grpc.CloudProviderStub) -> bool:
    """Whether a hot RPC is answered while the event loop is blocked (by the caller)."""
    request = pb.NodeGroupTargetSizeRequest(id="workers")
    try:
        stub.NodeGroupTargetSize(request, timeout=1.0)
        return True
    except grpc.RpcError:
        return False


def _blocking(call: Any) -> Any:
    """Runs `call` on a thread while this (the event loop's) thread waits for it."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join()
    return result[0]


async def test_hot_answers_follow_the_serving_deadline(stack: StackFactory, pki: PKI) -> None:
    """With leader election the transport answers by itself only until the deadline the
    last Lease renewal set (on its own clock); after it, or on a standby, every call goes to
    Python, whose gate refuses it."""
    s, _ = await two_groups(stack)
    channel, stub = sync_stub(pki, s.address)
    with channel:
        assert _blocking(lambda: _answered_with_loop_blocked(stub))
        s.server.serve_until(-math.inf)  # a standby
        assert not _blocking(lambda: _answered_with_loop_blocked(stub))
        s.server.serve_until(time.monotonic() + 30)  # renewed
        assert _blocking(lambda: _answered_with_loop_blocked(stub))
        s.server.serve_until(time.monotonic() + 0.2)  # not renewed in time
        await asyncio.sleep(0.3)
        assert not _blocking(lambda: _answered_with_loop_blocked(stub))
        s.server.serve_until(math.inf)
        assert _blocking(lambda: _answered_with_loop_blocked(stub))


async def test_a_gated_transport_serves_nothing_published_until_the_gate_opens(pki: PKI) -> None:
    """With leader election the transport starts closed: answers published at start (before
    the first Lease decision) are not served by a replica that may be a standby."""
    config = make_config(pki)
    running = await start_server(config, StandInServicer(config), gated=True)
    try:
        answer = pb.NodeGroupTargetSizeResponse(targetSize=1).SerializeToString()
        running.publish_answers("NodeGroupTargetSize", {"workers": answer})
        channel, stub = sync_stub(pki, address(running))
        with channel:
            assert not _blocking(lambda: _answered_with_loop_blocked(stub))
            running.serve_until(math.inf)  # control: the same call, the gate open
            assert _blocking(lambda: _answered_with_loop_blocked(stub))
    finally:
        await running.stop(5.0)


TEMPLATE_NODE_INFO = (
    "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/NodeGroupTemplateNodeInfo"
)


async def test_published_templates_are_byte_equal_to_the_servicers_for_both_generations(
    stack: StackFactory,
) -> None:
    groups = [
        group("workers", 0, 5),
        group(
            "tuned",
            0,
            3,
            autoscaling_options=TUNED,
            labels=(("tier", "batch"),),
            taints=(Taint("dedicated", "batch", "NoSchedule"),),
        ),
        group("gpu", 0, 2, flavor="gpu2-128-16-1-200", zone="rma1"),
    ]
    s = await stack(groups=groups)
    service, engine = s.provider.service, s.provider.service.engine
    raw = s.channel.unary_unary(TEMPLATE_NODE_INFO)  # bytes in, bytes out
    await s.refresh()  # builds them all
    first = engine.built_templates()
    for refresh in range(2):
        if refresh:
            await s.refresh()  # finds the same flavors and keeps them
        built = engine.built_templates()
        assert built is first
        assert sorted(built) == ["gpu", "tuned", "workers"]
        for name in built:
            request = pb.NodeGroupTemplateNodeInfoRequest(id=name)
            served = await raw(request.SerializeToString(), timeout=TIMEOUT)
            direct = await service.NodeGroupTemplateNodeInfo(request, _NoDeadline())
            assert served == direct.SerializeToString(), (refresh, name)
            # CA <= 1.34.1 reads the Node from field 1, newer CA from field 2: the same Node.
            reply = pb.NodeGroupTemplateNodeInfoResponse.FromString(served)
            assert reply.nodeBytes
            assert core_v1_pb2.Node.FromString(reply.nodeBytes) == reply.nodeInfo
        assert engine.built_templates() is built
    # An unknown group is a miss: the servicer's NOT_FOUND.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id="nope"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
