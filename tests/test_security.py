"""Security of the real provider: who may call it, how, and that the API token stays secret.

Already covered by the transport owner in tests/test_transport_tls.py (not repeated here):
the handshake refusing no client certificate, another CA, expired and not-yet-valid client
certificates and a server certificate presented as a client; allowedClients by CN/DNS SAN on
NodeGroups; TLS 1.1 refused and TLS 1.2 accepted. tests/test_server.py covers the 16 MiB
receive limit on a stand-in service.

Added here: a forged CA with our CA's very name; allowedClients guarding every CloudProvider
RPC of the REAL provider with nothing reaching the cloud; TLS 1.0 and plaintext refused; an
oversized DeleteNodes refused by the real provider with nothing deleted; and the API token
never appearing in logs (debug level), gRPC errors, /metrics or any response (debug field
included), with a bad token and an API that echoes the token back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from aiohttp import web
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import EmulatorAdmin, RunningEmulator
from fixtures.stack import Stack, group, group_tags, stack_config, start_stack
from fixtures.tls import PKI, client_ssl_context, grpc_channel, other_ca
from fixtures.tools import free_port

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.transport import certs

TIMEOUT = 10.0
Code = grpc.StatusCode
SERVICE = pb.DESCRIPTOR.services_by_name["CloudProvider"]
# Distinctive, and long enough for every redaction threshold.
TOKEN = "csTok-7Q2xVb9LmN4pR8sW1yZ3aC6dF0gH5jK"
WRONG_TOKEN = "csTok-WRONG-3mZ8qP1vX6bN4cL9kJ2hG7fD"


def every_rpc_request() -> list[tuple[str, Any]]:
    """(RPC name, a plausible request) for each of the 15 RPCs."""
    node = pb.ExternalGrpcNode(providerID="cloudscale://00000000-0000-4000-8000-000000000001")
    requests: dict[str, Any] = {
        "NodeGroupForNode": pb.NodeGroupForNodeRequest(node=node),
        "PricingNodePrice": pb.PricingNodePriceRequest(node=node),
        "NodeGroupTargetSize": pb.NodeGroupTargetSizeRequest(id="workers"),
        "NodeGroupIncreaseSize": pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1),
        "NodeGroupDeleteNodes": pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node]),
        "NodeGroupDecreaseTargetSize": pb.NodeGroupDecreaseTargetSizeRequest(
            id="workers", delta=-1
        ),
        "NodeGroupNodes": pb.NodeGroupNodesRequest(id="workers"),
        "NodeGroupTemplateNodeInfo": pb.NodeGroupTemplateNodeInfoRequest(id="workers"),
        "NodeGroupGetOptions": pb.NodeGroupAutoscalingOptionsRequest(id="workers"),
    }
    return [
        (m.name, requests.get(m.name) or getattr(pb, m.input_type.name)()) for m in SERVICE.methods
    ]


async def outcome(stub: Any, rpc: str, request: Any) -> tuple[Code, str, bytes]:
    """(code, details, serialized reply) of one call."""
    try:
        reply = await getattr(stub, rpc)(request, timeout=TIMEOUT)
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or "", b""
    return Code.OK, "", reply.SerializeToString()


# --- who may call -------------------------------------------------------------------------------


async def test_forged_ca_with_our_ca_name_is_refused(stack: Any, pki: PKI) -> None:
    """A client certificate from a CA that copies our CA's subject name (but not its key)."""
    s: Stack = await stack()
    forger = other_ca(certs.DEFAULT_CA_NAME)
    assert forger.cert.subject == pki.ca.cert.subject  # the forgery is exact by name
    forged = pki.client(ca=forger)
    async with grpc_channel(pki, s.address, client=forged) as channel:
        code, details, _ = await outcome(
            pb_grpc.CloudProviderStub(channel), "NodeGroups", pb.NodeGroupsRequest()
        )
    assert code == Code.UNAVAILABLE, details
    assert await s.target("workers") == 0  # control: the genuine client is served


async def test_allowed_clients_guard_every_rpc_of_the_real_provider(
    emulator: RunningEmulator, pki: PKI
) -> None:
    """A client certificate signed by our CA but named outside allowedClients gets
    PERMISSION_DENIED from every CloudProvider RPC, and nothing reaches the cloud API."""
    base = stack_config(emulator, pki, [group("workers", 0, 5)])
    tls = dataclasses.replace(base.tls, allowed_clients=("cluster-autoscaler",))
    registry: list[Stack] = []
    s = await start_stack(dataclasses.replace(base, tls=tls), emulator, pki, registry)
    try:
        uuid = (await emulator.admin.populate(1, group_tags("workers"), zone="lpg1"))[0]
        before = await emulator.admin.stats()
        intruder = pki.client("intruder")
        async with grpc_channel(pki, s.address, client=intruder) as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            answers = {rpc: await outcome(stub, rpc, req) for rpc, req in every_rpc_request()}
        denied = {rpc: code for rpc, (code, _, _) in answers.items()}
        assert set(denied.values()) == {Code.PERMISSION_DENIED}, denied
        assert len(denied) == 15
        assert await emulator.admin.stats() == before  # not one API request
        assert await emulator.admin.deletions() == []
        # Control: the allowed client can delete the very server the intruder could not.
        node = pb.ExternalGrpcNode(providerID=f"cloudscale://{uuid}")
        await s.stub.NodeGroupDeleteNodes(
            pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node]), timeout=TIMEOUT
        )
        assert [d["uuid"] for d in await emulator.admin.deletions()] == [uuid]
    finally:
        for running in registry:
            await running.stop()


def _handshake(port: int, context: ssl.SSLContext) -> str | None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.version()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1 is deprecated:DeprecationWarning")
async def test_tls_1_0_and_plaintext_are_refused(stack: Any, pki: PKI) -> None:
    s: Stack = await stack()
    old = client_ssl_context(pki, maximum_version=ssl.TLSVersion.TLSv1)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # let our OpenSSL offer TLS 1.0 at all
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await asyncio.to_thread(_handshake, s.server.port, old)
    async with grpc.aio.insecure_channel(s.address) as plain:
        code, details, _ = await outcome(
            pb_grpc.CloudProviderStub(plain), "NodeGroups", pb.NodeGroupsRequest()
        )
    assert code == Code.UNAVAILABLE, details
    # Control: a modern client negotiates TLS 1.2 or newer on the same port.
    modern = client_ssl_context(pki)
    assert await asyncio.to_thread(_handshake, s.server.port, modern) in ("TLSv1.2", "TLSv1.3")


async def test_oversized_delete_nodes_is_refused_and_deletes_nothing(stack: Any) -> None:
    s: Stack = await stack([group("workers", 0, 5)])
    uuid = (await s.admin.populate(1, group_tags("workers"), zone="lpg1"))[0]
    await s.refresh()
    label = "x" * 1000
    nodes = [pb.ExternalGrpcNode(providerID=f"cloudscale://{uuid}", labels={"l": label})]
    nodes += [pb.ExternalGrpcNode(name=f"n{i}", labels={"l": label}) for i in range(17_000)]
    request = pb.NodeGroupDeleteNodesRequest(id="workers", nodes=nodes)
    assert request.ByteSize() > 16 * 1024 * 1024
    code, details, _ = await outcome(s.stub, "NodeGroupDeleteNodes", request)
    assert code == Code.RESOURCE_EXHAUSTED, details
    assert await s.admin.deletions() == []
    assert await s.target("workers") == 1  # and the server still answers


# --- the API token stays secret ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def echoing_api(seen: list[str]) -> AsyncIterator[str]:
    """A hostile or broken API endpoint: rejects every request with 401 and puts the
    Authorization header it received into the error, as JSON and as plain text."""

    async def answer(request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        seen.append(header)
        if request.path.endswith("/flavors"):
            return web.Response(status=500, text=f"upstream failed for {header}")
        return web.json_response({"detail": f"Invalid token: {header}"}, status=401)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def exercise(serve: ServeProcess, pki: PKI, admin: EmulatorAdmin | None) -> list[str]:
    """Every RPC, succeeding and failing, plus /metrics, /healthz, /readyz and /status:
    everything a client or scraper receives, as text (replies' bytes decoded, error details)."""
    seen: list[str] = []
    async with grpc_channel(pki, serve.address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        calls = [*every_rpc_request(), ("NodeGroups", pb.NodeGroupsRequest())]
        calls += [
            ("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id="workers", delta=99)),
            ("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id="nope", delta=0)),
            ("NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(id="workers")),
            ("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id="nope")),
        ]
        if admin is not None:  # API errors carrying the API's own words
            await admin.set_faults(
                {
                    "error_rate": {"list_servers": {"rate": 1.0, "status": 400}},
                    "fail_next_creates": {"count": 1, "kind": "invalid"},
                }
            )
            increase = pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1)
            calls += [("Refresh", pb.RefreshRequest()), ("NodeGroupIncreaseSize", increase)]
        for rpc, request in calls:
            code, details, reply = await outcome(stub, rpc, request)
            seen.append(f"{rpc} {code.name} {details} {reply.decode(errors='replace')}")
        if admin is not None:
            await admin.clear_faults()
    assert serve.metrics_port is not None
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{serve.metrics_port}") as http:
        for path in ("/metrics", "/healthz", "/readyz", "/status"):
            seen.append((await http.get(path)).text)
    return seen


def assert_secret(token: str, texts: list[str]) -> None:
    for text in texts:
        for probe in (token, token[:16], token[-16:]):
            assert probe not in text, f"token fragment {probe!r} leaked in:\n{text[:2000]}"


async def test_token_never_leaks(tmp_path: Path, pki: PKI) -> None:
    """`serve --log-level debug` with a distinctive token: normal work, API errors, a bad
    token refused by an API that echoes it back; the token appears nowhere."""
    # 1. The right token, against the emulator; API errors on the way.
    emulator = RunningEmulator(token=TOKEN)
    await emulator.start("127.0.0.1", 0)
    emulator.admin = EmulatorAdmin(emulator.admin_url)
    groups = [
        {"name": "workers", "minSize": 0, "maxSize": 3, "flavor": "flex-4-2",
         "image": "debian-12", "zone": "lpg1",
         "autoscalingOptions": {"scaleDownUtilizationThreshold": 0.4}},
    ]  # fmt: skip
    metrics = {"listen": f"127.0.0.1:{free_port()}"}
    config = write_config(
        tmp_path / "good", pki, emulator.url, TOKEN, groups=groups, token_mode=0o644,
        metrics=metrics,
    )  # fmt: skip
    try:
        serve = await start_serve(config, metrics=True)
        try:
            answers = await exercise(serve, pki, emulator.admin)
            created = [s for s in await emulator.admin.servers() if s["tags"]]
        finally:
            await serve.stop()
    finally:
        await emulator.admin.aclose()
        await emulator.stop()
    output = serve.output
    assert created, "the token worked: servers were created"
    assert "NodeGroupIncreaseSize" in output  # debug logging of RPCs was on
    assert any("cloudscale_autoscaler_grpc_requests" in text for text in answers)
    assert "readable by others" in output and str(tmp_path / "good" / "token") in output
    assert_secret(TOKEN, [output, *answers])

    # 2. A wrong token, refused by an API that echoes it in its errors.
    echoed: list[str] = []
    async with echoing_api(echoed) as url:
        metrics = {"listen": f"127.0.0.1:{free_port()}"}
        config = write_config(tmp_path / "bad", pki, url, WRONG_TOKEN, metrics=metrics)
        serve = await start_serve(config, metrics=True)
        try:
            answers = await exercise(serve, pki, None)
        finally:
            await serve.stop()
    assert f"Bearer {WRONG_TOKEN}" in echoed  # the API really did get it, and echo it
    assert any("UNAVAILABLE" in text and "401" in text for text in answers), answers
    # The echo did travel through to CA's error messages and the log, minus the token.
    assert any("Invalid token: Bearer " in text for text in answers), answers
    assert "Invalid token: Bearer " in serve.output
    assert_secret(WRONG_TOKEN, [serve.output, *answers])
