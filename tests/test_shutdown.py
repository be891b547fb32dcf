"""Graceful shutdown of `cloudscale-autoscaler serve` (a real process) with creations in
flight: SIGTERM leaves no untagged server and loses no accounting. The next process, after
a Refresh, counts exactly the servers the cloud holds with the group's tags.

Creations are slowed to 2 s by the emulator so the signal lands while they are in flight
(sent, or still queued behind maxConcurrentCreates); a second SIGTERM abandons them at once.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import grpc
import pytest
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.stack import wait_until
from fixtures.tls import PKI, grpc_channel

from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP, TAG_REQUEST
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc

CLUSTER = "shut"
TIMEOUT = 10.0
GROUP = {"name": "workers", "minSize": 0, "maxSize": 10, "flavor": "flex-4-2",
         "image": "debian-12", "zone": "lpg1"}  # fmt: skip


async def stub_call(address: str, pki: PKI, rpc: str, request: object) -> object:
    async with grpc_channel(pki, address) as channel:
        return await getattr(pb_grpc.CloudProviderStub(channel), rpc)(request, timeout=TIMEOUT)


async def group_view(address: str, pki: PKI) -> tuple[int, set[str]]:
    """(TargetSize, NodeGroupNodes ids) after a Refresh, as CA would read them."""
    async with grpc_channel(pki, address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        await stub.Refresh(pb.RefreshRequest(), timeout=TIMEOUT)
        size = await stub.NodeGroupTargetSize(
            pb.NodeGroupTargetSizeRequest(id="workers"), timeout=TIMEOUT
        )
        nodes = await stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="workers"), timeout=TIMEOUT)
    return size.targetSize, {i.id for i in nodes.instances}


async def serve_with_creates_in_flight(
    config: Path, pki: PKI, emulator: RunningEmulator, delta: int, max_creates: int, ms: int
) -> ServeProcess:
    """A `serve` process that was asked for `delta` servers, each create held `ms` by the
    API, returned once min(delta, max_creates) creates have reached the API."""
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": ms}}})
    serve = await start_serve(config, log_level="info")
    try:
        await stub_call(serve.address, pki, "Refresh", pb.RefreshRequest())
        request = pb.NodeGroupIncreaseSizeRequest(id="workers", delta=delta)
        await stub_call(serve.address, pki, "NodeGroupIncreaseSize", request)

        async def creations_out() -> bool:
            in_flight = (await emulator.admin.in_flight()).get("create_server", 0)
            return in_flight == min(delta, max_creates)

        await wait_until(creations_out, 30, "creations did not reach the API")
    except BaseException:
        await serve.kill()
        raise
    return serve


@pytest.mark.parametrize(
    ("max_creates", "signals", "expected_servers"),
    [(10, 1, 4), (1, 1, 1), (10, 2, None)],
    ids=["in-flight-finish", "queued-dropped", "second-signal-abandons"],
)
async def test_sigterm_with_creations_in_flight(
    tmp_path: Path,
    pki: PKI,
    emulator: RunningEmulator,
    max_creates: int,
    signals: int,
    expected_servers: int | None,
) -> None:
    config = write_config(
        tmp_path, pki, emulator.url, TOKEN, cluster=CLUSTER, groups=[GROUP],
        cloudscale={"maxConcurrentCreates": max_creates},
    )  # fmt: skip
    first = await serve_with_creates_in_flight(config, pki, emulator, 4, max_creates, 2000)
    try:
        first.process.send_signal(signal.SIGTERM)
        if signals == 2:
            await first.wait_for_output("received SIGTERM")
            first.process.send_signal(signal.SIGTERM)
        code = await first.stop(None, limit=60)
    finally:
        await first.kill()
    assert code == (0 if signals == 1 else -signal.SIGTERM), first.output
    if (max_creates, signals) == (1, 1):  # one sent, three queued behind it
        assert "shutting down: 3 creation(s) of node group workers never sent" in first.output

    # Let the API finish whatever reached it (an abandoned request still creates a server).
    await emulator.admin.clear_faults()

    async def api_idle() -> bool:
        return not (await emulator.admin.in_flight()).get("create_server", 0)

    await wait_until(api_idle, 30, "the API is still creating")
    servers = await emulator.admin.servers()
    assert_tagged(servers, CLUSTER)
    if expected_servers is not None:
        assert len(servers) == expected_servers, first.output
    await assert_next_process_counts(config, pki, servers)


def assert_tagged(servers: list[dict[str, Any]], cluster: str) -> None:
    """Every server carries the cluster, group and request tags."""
    for server in servers:
        tags = server["tags"]
        assert tags.get(TAG_CLUSTER) == cluster and tags.get(TAG_GROUP) == "workers", server
        assert tags.get(TAG_REQUEST), server


async def assert_next_process_counts(config: Path, pki: PKI, servers: list[dict[str, Any]]) -> None:
    """A new `serve` process, after a Refresh, counts exactly these servers."""
    second = await start_serve(config, log_level="info")
    try:
        size, ids = await group_view(second.address, pki)
    finally:
        await second.stop()
    assert size == len(servers)
    assert ids == {f"cloudscale://{s['uuid']}" for s in servers}


async def test_sigterm_refuses_new_creations_while_draining(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    """Between SIGTERM and exit no new RPC is accepted (the server stops listening first), so
    nothing new is created; the process exits 0 and the cloud holds what was started."""
    config = write_config(tmp_path, pki, emulator.url, TOKEN, cluster=CLUSTER, groups=[GROUP])
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 2000}}})
    serve = await start_serve(config, log_level="info")
    try:
        await stub_call(
            serve.address,
            pki,
            "NodeGroupIncreaseSize",
            pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2),
        )

        async def both_sent() -> bool:  # once the creation journal holds them
            return (await emulator.admin.in_flight()).get("create_server", 0) == 2

        await wait_until(both_sent, 30, "the two creates were never sent")
        serve.process.send_signal(signal.SIGTERM)

        async def not_serving() -> bool:
            try:
                await stub_call(
                    serve.address,
                    pki,
                    "NodeGroupIncreaseSize",
                    pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1),
                )
            except grpc.aio.AioRpcError as error:
                return error.code() == grpc.StatusCode.UNAVAILABLE
            return False

        await wait_until(not_serving, 30, "the server kept accepting calls after SIGTERM")
        code = await serve.stop(None, limit=60)
    finally:
        await serve.kill()
    assert code == 0, serve.output
    await emulator.admin.clear_faults()
    servers = await emulator.admin.servers()
    assert len(servers) == 2, serve.output
