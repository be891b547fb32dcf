"""The serving gate (leader election): its state rules, and every CloudProvider RPC refused
through the real gRPC server while it is closed."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
from fixtures.emulator import FakeClock
from fixtures.stack import StackFactory
from fixtures.tls import grpc_channel

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.service.gate import gated
from cloudscale_autoscaler.service.serving import Serving
from cloudscale_autoscaler.transport.server import RPC_NAMES, start_server

LEASE = "kube-system/cloudscale-autoscaler"


def test_without_leader_election_always_serves() -> None:
    serving = Serving()
    assert serving.active and serving.refusal() is None


def test_states_and_messages() -> None:
    clock = FakeClock()
    seen: list[bool] = []
    serving = Serving(LEASE, clock=clock)
    serving.subscribe(seen.append)
    assert serving.refusal() == f"this replica is a standby (Lease {LEASE}): no leader is known yet"
    serving.serve_until(clock() + 2)
    assert serving.active and serving.refusal() is None and seen == [True]
    serving.serve_until(clock() + 4)  # a renewal: no new event
    assert serving.until == clock() + 4
    clock.advance(3.9)
    assert serving.active and seen == [True]
    clock.advance(0.2)  # past the renew deadline: closed without anyone calling stand_by
    assert not serving.active
    assert serving.refusal() == (
        f"this replica lost leadership (Lease {LEASE} not renewed in time) and no longer "
        "serves; retry against the current leader"
    )
    serving.serve_until(clock() + 1)  # a late renewal: open again, listeners never saw it shut
    assert serving.active and seen == [True]
    clock.advance(1.1)
    # The Lease is lost after the deadline closed the gate: the listeners (the EndpointSlice,
    # gRPC health, the LeadershipLost Event) hear of it now, once.
    serving.stand_by("replica-b")
    assert seen == [True, False]
    standby = f"this replica is a standby (Lease {LEASE}): the leader is replica-b"
    assert serving.refusal() == standby
    serving.stand_by("replica-b")
    assert seen == [True, False]
    serving.serve_until(clock() + 1)
    serving.stand_by(None)
    assert seen == [True, False, True, False]


async def test_every_rpc_is_refused_while_standby(stack: StackFactory) -> None:
    s = await stack()
    clock = FakeClock()
    serving = Serving(LEASE, clock=clock)
    serving.leader = "replica-a"
    server = await start_server(s.config, gated(s.provider.service, serving), listen="127.0.0.1:0")
    try:
        async with grpc_channel(s.pki, f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            methods = pb.DESCRIPTOR.services_by_name["CloudProvider"].methods_by_name
            for name in RPC_NAMES:
                request = getattr(pb, methods[name].input_type.name)()
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await getattr(stub, name)(request, timeout=5)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, name
                assert "the leader is replica-a" in str(caught.value.details()), name
            serving.serve_until(clock() + 10)
            reply = await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
            assert [g.id for g in reply.nodeGroups] == ["workers"]
    finally:
        await server.stop(0)


def test_nothing_loads_kubernetes_without_the_section() -> None:
    """The serve path (command, app, CLI, service, gate) imports the kubernetes package only
    when the config has a `kubernetes:` section."""
    code = (
        "import sys, cloudscale_autoscaler.app, cloudscale_autoscaler.cli, "
        "cloudscale_autoscaler.commands.serve, cloudscale_autoscaler.config; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
