"""The real transport server: routing, health, reflection, limits, logging, shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import grpc
import h2.connection
import h2.events
import pytest
from fixtures.emulator import TOKEN as EMULATOR_TOKEN
from fixtures.emulator import RunningEmulator
from fixtures.tls import (
    PKI,
    StandInServicer,
    address,
    client_ssl_context,
    grpc_channel,
    make_config,
    serving,
)
from fixtures.tools import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from cloudscale_autoscaler.observability.logs import request_id_var
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.settings.types import Config
from cloudscale_autoscaler.transport.server import ListenError, start_server

TIMEOUT = 10.0
SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
# The 15 RPCs of the externalgrpc contract (reference table), spelled out independently of
# our own proto so that a renamed or missing RPC fails here.
RPCS = [
    "NodeGroups",
    "NodeGroupForNode",
    "PricingNodePrice",
    "PricingPodPrice",
    "GPULabel",
    "GetAvailableGPUTypes",
    "Cleanup",
    "Refresh",
    "NodeGroupTargetSize",
    "NodeGroupIncreaseSize",
    "NodeGroupDeleteNodes",
    "NodeGroupDecreaseTargetSize",
    "NodeGroupNodes",
    "NodeGroupTemplateNodeInfo",
    "NodeGroupGetOptions",
]


def raw_call(channel: grpc.aio.Channel, method: str) -> Any:
    """A unary call carrying pre-serialized bytes, for any method name."""
    identity = lambda data: data  # noqa: E731
    return channel.unary_unary(method, request_serializer=identity, response_deserializer=identity)


async def test_every_rpc_is_routed(pki: PKI) -> None:
    async with serving(make_config(pki)) as running, grpc_channel(pki, address(running)) as ch:
        outcomes: dict[str, tuple[grpc.StatusCode, str]] = {}
        for rpc in RPCS:
            try:
                await raw_call(ch, f"/{SERVICE}/{rpc}")(b"", timeout=TIMEOUT)
                outcomes[rpc] = (grpc.StatusCode.OK, "")
            except grpc.aio.AioRpcError as error:
                outcomes[rpc] = (error.code(), error.details() or "")
        # Control: a method the server does not know gets gRPC's generic answer.
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await raw_call(ch, f"/{SERVICE}/NoSuchRpc")(b"", timeout=TIMEOUT)
    assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert unknown.value.details() == "Method not found!"
    served = {"NodeGroups", "Cleanup"}  # what StandInServicer implements
    for rpc, (code, details) in outcomes.items():
        if rpc in served:
            assert code == grpc.StatusCode.OK, rpc
        else:
            assert (code, details) == (
                grpc.StatusCode.UNIMPLEMENTED,
                f"{rpc} is not implemented by cloudscale-autoscaler",
            )


def _status_of_a_call_without_its_body(port: int, pki: PKI, path: str, timeout: str) -> str:
    """Sends a call's headers (with grpc-timeout) and never its body; the grpc-status and
    grpc-message the server ends it with."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw,
        client_ssl_context(pki).wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        connection = h2.connection.H2Connection()
        connection.initiate_connection()
        headers = [
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", "localhost"),
            (":path", path),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", timeout),
        ]
        connection.send_headers(1, headers)
        tls.sendall(connection.data_to_send())
        while True:
            data = tls.recv(65536)
            assert data, "the server closed the connection without ending the call"
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    fields = {bytes(k).decode(): bytes(v).decode() for k, v in event.headers}
                    if "grpc-status" in fields:
                        return f"{fields['grpc-status']} {fields.get('grpc-message', '')}"
                if isinstance(event, h2.events.StreamReset):
                    return f"reset {event.error_code}"
            tls.sendall(connection.data_to_send())


async def test_a_deadline_counts_from_the_call_s_start_not_its_body(pki: PKI) -> None:
    # A large DeleteNodes whose body is still arriving when the caller's deadline passes
    # ends DEADLINE_EXCEEDED, as from any gRPC server (not CANCELLED, nor late).
    async with serving(make_config(pki)) as running:
        path = f"/{SERVICE}/NodeGroupDeleteNodes"
        code = await asyncio.to_thread(
            _status_of_a_call_without_its_body, running.port, pki, path, "300m"
        )
    assert code == f"{grpc.StatusCode.DEADLINE_EXCEEDED.value[0]} Deadline Exceeded"


async def test_a_malformed_grpc_timeout_is_refused_naming_it(
    pki: PKI, capfd: pytest.CaptureFixture[str]
) -> None:
    # gRPC allows at most 8 digits; a longer one once overflowed the deadline arithmetic and
    # the transport panicked (stream reset, backtrace on stderr, no metric). grpc-go's server
    # refuses such a call INTERNAL, naming the value.
    async with serving(make_config(pki)) as running:
        path = f"/{SERVICE}/NodeGroups"
        outcomes = [
            await asyncio.to_thread(
                _status_of_a_call_without_its_body, running.port, pki, path, timeout
            )
            for timeout in ("10000000000000000000S", "5x")
        ]
        counted = {r.method: r.codes for r in running.rpc_readings()}["NodeGroups"]
    internal = grpc.StatusCode.INTERNAL.value[0]
    assert outcomes == [
        f'{internal} malformed grpc-timeout "10000000000000000000S": expected 1 to 8 digits '
        "and a unit (H, M, S, m, u or n)",
        f'{internal} malformed grpc-timeout "5x": expected 1 to 8 digits and a unit '
        "(H, M, S, m, u or n)",
    ]
    assert counted == {"INTERNAL": 2}
    assert "panicked" not in capfd.readouterr().err


async def test_health_serving(pki: PKI) -> None:
    async with serving(make_config(pki)) as running, grpc_channel(pki, address(running)) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", SERVICE):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def _reflect(
    channel: grpc.aio.Channel, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(iter([request]), timeout=TIMEOUT)
    responses = [response async for response in call]
    assert len(responses) == 1
    return responses[0]


async def test_reflection_lists_and_describes_the_service(pki: PKI) -> None:
    from google.protobuf import descriptor_pb2

    async with serving(make_config(pki)) as running, grpc_channel(pki, address(running)) as ch:
        listing = await _reflect(ch, reflection_pb2.ServerReflectionRequest(list_services=""))
        described = await _reflect(
            ch, reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)
        )
    names = {s.name for s in listing.list_services_response.service}
    assert names == {
        SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    services = {f"{f.package}.{s.name}": s for f in files for s in f.service}
    assert [m.name for m in services[SERVICE].method] == RPCS


def _delete_nodes_request(total_bytes: int) -> bytes:
    label = "x" * 1000
    count = total_bytes // 1020 + 1
    nodes = [pb.ExternalGrpcNode(name=f"n{i}", labels={"l": label}) for i in range(count)]
    return pb.NodeGroupDeleteNodesRequest(id="workers", nodes=nodes).SerializeToString()


async def test_message_size_limit(pki: PKI) -> None:
    method = f"/{SERVICE}/NodeGroupDeleteNodes"
    async with serving(make_config(pki)) as running, grpc_channel(pki, address(running)) as ch:
        # 8 MiB (twice gRPC's default limit) reaches the servicer ...
        with pytest.raises(grpc.aio.AioRpcError) as accepted:
            await raw_call(ch, method)(_delete_nodes_request(8 << 20), timeout=TIMEOUT)
        # ... 17 MiB does not.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await raw_call(ch, method)(_delete_nodes_request(17 << 20), timeout=TIMEOUT)
    assert accepted.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_insecure_serves_plaintext_with_a_warning(
    pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(pki, insecure=True)
    caplog.set_level(logging.WARNING, logger="cloudscale_autoscaler.transport.server")
    async with (
        serving(config) as running,
        grpc.aio.insecure_channel(address(running)) as channel,
    ):
        reply = await pb_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest())
    assert len(reply.nodeGroups) == 2
    assert any("WITHOUT TLS" in r.getMessage() for r in caplog.records)


async def test_port_in_use_is_an_error_naming_the_address(pki: PKI) -> None:
    config = make_config(pki)
    async with serving(config) as running:
        taken = address(running)
        with pytest.raises(ListenError, match=taken):
            await start_server(config, StandInServicer(config), listen=taken)


class _SeesRequestIds(StandInServicer):
    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.seen: list[str | None] = []

    async def NodeGroups(self, request: Any, context: Any) -> pb.NodeGroupsResponse:
        self.seen.append(request_id_var.get())
        return await super().NodeGroups(request, context)


async def test_debug_log_line_per_rpc_with_request_id(
    pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(pki)
    servicer = _SeesRequestIds(config)
    caplog.set_level(logging.DEBUG, logger="cloudscale_autoscaler.transport.calls")
    async with serving(config, servicer) as running, grpc_channel(pki, address(running)) as ch:
        stub = pb_grpc.CloudProviderStub(ch)
        for _ in range(2):
            await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Refresh(pb.RefreshRequest(), timeout=TIMEOUT)
    lines = [r for r in caplog.records if r.name.endswith("transport.calls")]
    assert [(r.method, r.code) for r in lines] == [  # type: ignore[attr-defined]
        (f"/{SERVICE}/NodeGroups", "OK"),
        (f"/{SERVICE}/NodeGroups", "OK"),
        (f"/{SERVICE}/Refresh", "UNIMPLEMENTED"),
    ]
    ids = [r.request_id for r in lines]  # type: ignore[attr-defined]
    assert ids[:2] == servicer.seen
    assert len(set(ids)) == 3 and all(ids)


class _Slow(StandInServicer):
    """NodeGroups waits for the test to release it."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def NodeGroups(self, request: Any, context: Any) -> pb.NodeGroupsResponse:
        self.entered.set()
        await self.release.wait()
        return await super().NodeGroups(request, context)


async def test_graceful_stop_finishes_in_flight_rpcs(pki: PKI) -> None:
    config = make_config(pki)
    servicer = _Slow(config)
    running = await start_server(config, servicer, reload_interval=0)
    async with grpc_channel(pki, address(running)) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        in_flight = asyncio.ensure_future(
            pb_grpc.CloudProviderStub(ch).NodeGroups(pb.NodeGroupsRequest(), timeout=30)
        )
        await servicer.entered.wait()
        stopping = asyncio.ensure_future(running.stop(grace=30))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()  # a Watch stream never ends by itself; it would hold the grace period
        servicer.release.set()
        reply = await in_flight
        await stopping
    assert len(reply.nodeGroups) == 2


def _write_serve_config(pki: PKI, directory: Path, cloud_url: str) -> Path:
    config = {
        "cluster": "sigterm-test",
        "listen": f"127.0.0.1:{free_port()}",
        "tls": {
            "cert": str(pki.server_cert),
            "key": str(pki.server_key),
            "clientCA": str(pki.ca_cert),
            "allowedClients": ["cluster-autoscaler"],
        },
        "cloudscale": {"url": cloud_url},
        "nodeGroups": [
            {"name": "workers", "minSize": 1, "maxSize": 4, "flavor": "flex-4-2",
             "image": "debian-12"},
        ],
    }  # fmt: skip
    path = directory / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


async def _port_from_log(stderr: asyncio.StreamReader, seen: list[str]) -> int:
    while line := await stderr.readline():
        seen.append(line.decode())
        try:
            record = json.loads(line)
        except ValueError:
            continue  # not ours to parse; kept in `seen` for the failure message
        if record.get("message") == "gRPC server listening":
            return int(record["port"])
    raise AssertionError("server exited before listening:\n" + "".join(seen))


async def _drain(stderr: asyncio.StreamReader, seen: list[str]) -> None:
    while line := await stderr.readline():
        seen.append(line.decode())


async def test_sigterm_stops_serve_gracefully(
    pki: PKI, tmp_path: Path, emulator: RunningEmulator
) -> None:
    """The whole `serve` command (real service and engine, against the emulator)."""
    config_path = _write_serve_config(pki, tmp_path, emulator.url)
    env = {**os.environ, "CLOUDSCALE_API_TOKEN": EMULATOR_TOKEN}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cloudscale_autoscaler", "--log-format", "json",
        "serve", "--config", str(config_path),
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert process.stderr is not None
    seen: list[str] = []
    try:
        port = await asyncio.wait_for(_port_from_log(process.stderr, seen), 60)
        drain = asyncio.ensure_future(_drain(process.stderr, seen))
        async with grpc_channel(pki, f"127.0.0.1:{port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            groups = await pb_grpc.CloudProviderStub(ch).NodeGroups(
                pb.NodeGroupsRequest(), timeout=TIMEOUT
            )
            assert [(g.id, g.minSize, g.maxSize) for g in groups.nodeGroups] == [("workers", 1, 4)]
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
        await drain
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0, "".join(seen)
    assert any("SIGTERM" in line for line in seen)
    assert any("gRPC server stopped" in line for line in seen)


async def test_a_second_stop_waits_for_the_first(pki: PKI) -> None:
    config = make_config(pki)
    running = await start_server(config, StandInServicer(config), reload_interval=0)
    await asyncio.wait_for(asyncio.gather(running.stop(1), running.stop(1)), 10)
    await running.stop(1)  # and a late one returns at once
