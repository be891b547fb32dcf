"""The transport stays bounded under any authenticated client: a real `serve` process, flooded
over real mTLS connections, keeps its peak RSS (VmHWM) under the chart's 384 MiB memory limit,
answers a legitimate client (CA's stand-in: NodeGroups every 0.2 s on its own connection)
within CA's 5 s deadline throughout, and is back within 1.5x of its idle RSS once the flood
is over (the issue allows a minute; the test waits at most that).

The floods, each what a probe did to the server before its limits (transport/limits.py):
- 40 concurrent 15.9 MiB NodeGroupDeleteNodes on one connection, three times (peak was 5 GiB);
- 5 connections x 20,000 streams of headers only, never a body (all held: +400 MiB, kept);
- 300 idle connections of a client the CA signed but allowedClients refuses (held forever).

A flood is cut short once the RSS has crossed the limit: the test has failed by then, and the
machine is spared the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import hpack
import pytest
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import TOKEN
from fixtures.tls import PKI, client_ssl_context, grpc_channel
from fixtures.tools import cli, free_port

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.transport.limits import (
    IDLE_TIMEOUT_SECONDS,
    KEEPALIVE_TIMEOUT_SECONDS,
    MAX_RECEIVE_BYTES,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MIB = 1024 * 1024
CHART_LIMIT_KIB = 384 * 1024
CA_DEADLINE = 5.0
BACK_TO_IDLE_SECONDS = 60.0
SERVICE = "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, SETTINGS = 0x1, 0x4
END_HEADERS, ACK = 0x4, 0x1


def status_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@dataclass
class Outcome:
    idle_kib: int
    peak_kib: int
    back_kib: int
    calls: int
    slowest: float

    def __str__(self) -> str:
        return (
            f"idle {self.idle_kib // 1024} MiB, peak {self.peak_kib // 1024} MiB, back to "
            f"{self.back_kib // 1024} MiB; {self.calls} legitimate calls, slowest "
            f"{self.slowest:.2f} s"
        )


class Legitimate:
    """CA's stand-in: one NodeGroups call every 0.2 s on one connection until stopped."""

    def __init__(self, address: str, pki: PKI) -> None:
        self.address, self.pki = address, pki
        self.calls, self.slowest = 0, 0.0
        self.stopped = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        async with grpc_channel(self.pki, self.address) as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            while not self.stopped.is_set():
                started = loop.time()
                await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=CA_DEADLINE)
                self.slowest = max(self.slowest, loop.time() - started)
                self.calls += 1
                await asyncio.sleep(0.2)


async def watch_rss(pid: int, flood: asyncio.Task[None]) -> None:
    """Cancels the flood once the process is over the chart's limit."""
    while not flood.done():
        if status_kib(pid, "VmRSS") > CHART_LIMIT_KIB:
            flood.cancel()
            return
        await asyncio.sleep(0.05)


async def back_to_idle(pid: int, idle_kib: int) -> int:
    """The RSS once it is within 1.5x of `idle_kib`, or after BACK_TO_IDLE_SECONDS."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BACK_TO_IDLE_SECONDS
    while (rss := status_kib(pid, "VmRSS")) > 1.5 * idle_kib:
        if loop.time() > deadline:
            break
        await asyncio.sleep(0.5)
    return rss


async def under_flood(serve: ServeProcess, pki: PKI, flood: Awaitable[None]) -> Outcome:
    """Runs `flood` against `serve` with a legitimate client calling throughout; the
    process's memory before, at its peak during, and after it."""
    pid = serve.process.pid
    legitimate = Legitimate(serve.address, pki)
    calling = asyncio.create_task(legitimate.run())
    try:
        while legitimate.calls < 3:  # connected, and the answers' memory in place
            await asyncio.sleep(0.1)
            assert not calling.done(), calling
        idle_kib = status_kib(pid, "VmRSS")
        with open(f"/proc/{pid}/clear_refs", "w") as clear:  # noqa: ASYNC230 (procfs)
            clear.write("5")  # VmHWM from now on
        flooding = asyncio.ensure_future(flood)
        watching = asyncio.create_task(watch_rss(pid, flooding))
        with contextlib.suppress(asyncio.CancelledError):
            await flooding
        await watching
        peak_kib = status_kib(pid, "VmHWM")
        back_kib = await back_to_idle(pid, idle_kib)
    finally:
        legitimate.stopped.set()
        await calling  # raises if a legitimate call failed or missed its deadline
    return Outcome(idle_kib, peak_kib, back_kib, legitimate.calls, legitimate.slowest)


def assert_bounded(outcome: Outcome) -> None:
    assert outcome.peak_kib < CHART_LIMIT_KIB, f"over the chart's 384 MiB: {outcome}"
    assert outcome.slowest < CA_DEADLINE, str(outcome)
    assert outcome.back_kib <= 1.5 * outcome.idle_kib, f"not back near idle: {outcome}"


@contextlib.asynccontextmanager
async def serve_process(tmp_path: Path, pki: PKI, **top: Any) -> AsyncIterator[ServeProcess]:
    """`serve` with the floods' config, and the API emulator it calls."""
    async with emulator_process(tmp_path) as api_url:
        config = write_config(tmp_path, pki, api_url, TOKEN, cluster="flood", **top)
        serve = await start_serve(config, log_level="info")
        try:
            yield serve
        finally:
            await serve.kill()


@contextlib.asynccontextmanager
async def emulator_process(directory: Path) -> AsyncIterator[str]:
    """The API emulator in a process of its own; its /v1 URL. On this test's event loop (the
    `emulator` fixture) it answers the server only between the floods' sends, and a round of
    40 x 16 MiB holds that loop for half a second at a time: the legitimate calls that wait for
    the API (Refresh, DeleteNodes) would be slowed by this test's own client, not by the server
    (by over a second in that flood)."""
    port = free_port()
    argv = cli("emulator", "--listen", f"127.0.0.1:{port}", "--token", TOKEN, "--boot-seconds", "0")
    log = directory / "emulator.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(*argv, stdout=output, stderr=output)
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while not await accepts(port):
            if process.returncode is not None or asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"the emulator is not listening:\n{output_of(log)}")
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


def output_of(log: Path) -> str:
    return log.read_text(errors="replace")


def big_delete_nodes() -> bytes:
    """A NodeGroupDeleteNodesRequest of 15.9 MiB: 8 KiB nodes, as many as fit."""
    labels = {f"example.com/label-{j}": "x" * 200 for j in range(36)}

    def node(i: int) -> pb.ExternalGrpcNode:
        return pb.ExternalGrpcNode(
            providerID=f"cloudscale://{i:08x}-0000-4000-8000-000000000000",
            name=f"flood-worker-{i}",
            labels=labels,
        )

    per_node = pb.NodeGroupDeleteNodesRequest(nodes=[node(0)]).ByteSize()
    count = int(15.9 * MIB) // per_node
    request = pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node(i) for i in range(count)])
    data = request.SerializeToString()
    assert 15.8 * MIB < len(data) <= MAX_RECEIVE_BYTES
    return data


async def test_concurrent_16_mib_delete_nodes_stay_under_the_memory_limit(
    tmp_path: Path, pki: PKI
) -> None:
    payload = big_delete_nodes()
    codes: list[grpc.StatusCode] = []

    async def flood(channel: grpc.aio.Channel) -> None:
        delete_nodes = channel.unary_unary(f"{SERVICE}/NodeGroupDeleteNodes")  # bytes as is
        for _ in range(3):
            calls = [delete_nodes(payload, timeout=60) for _ in range(40)]
            for result in await asyncio.gather(*calls, return_exceptions=True):
                assert isinstance(result, grpc.aio.AioRpcError), result
                codes.append(result.code())

    async with serve_process(tmp_path, pki) as serve:
        options = [("grpc.max_send_message_length", 32 * MIB)]
        async with grpc_channel(pki, serve.address, options=options) as channel:
            outcome = await under_flood(serve, pki, flood(channel))
    print(f"40 x 15.9 MiB DeleteNodes, 3 rounds: {outcome}")
    assert_bounded(outcome)
    # Admitted calls reach the provider (none of these nodes is one of its servers); the
    # rest are refused at their length prefix, the budget named.
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert len(codes) == 120


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    head = struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream)
    return head + payload


async def h2_open(
    address: str, context: object
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw HTTP/2 connection: preface and SETTINGS sent, the server's SETTINGS acked."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
    writer.write(PREFACE + frame(SETTINGS, 0, 0))
    while True:
        head = await reader.readexactly(9)
        await reader.readexactly(int.from_bytes(head[:3]))
        if head[3] == SETTINGS and not head[4] & ACK:
            writer.write(frame(SETTINGS, ACK, 0))
            await writer.drain()
            return reader, writer


async def until_closed(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError):
        while await reader.read(65536):
            pass


@dataclass
class Opened:
    writer: asyncio.StreamWriter
    streams: int
    draining: asyncio.Task[None]  # done once the server closed the connection


async def bodiless_streams(address: str, pki: PKI, count: int) -> Opened:
    """Opens `count` TargetSize calls of headers only (no body, no deadline), ignoring the
    server's SETTINGS limit as an adversary would; stops early if the server closes."""
    reader, writer = await h2_open(address, client_ssl_context(pki))
    draining = asyncio.create_task(until_closed(reader))
    encoder = hpack.Encoder()
    headers = [
        (":method", "POST"),
        (":scheme", "https"),
        (":authority", "localhost"),
        (":path", f"{SERVICE}/NodeGroupTargetSize"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    first = encoder.encode(headers)
    indexed = encoder.encode(headers)  # the same block for every later stream
    writer.write(frame(HEADERS, END_HEADERS, 1, first))
    sent = 1
    with contextlib.suppress(ConnectionError):
        for start in range(1, count, 500):
            streams = range(start, min(start + 500, count))
            writer.write(b"".join(frame(HEADERS, END_HEADERS, 2 * s + 1, indexed) for s in streams))
            await writer.drain()
            sent += len(streams)
            if draining.done():
                break
    return Opened(writer, sent, draining)


async def test_bodiless_streams_stay_under_the_memory_limit(tmp_path: Path, pki: PKI) -> None:
    connections: list[Opened] = []
    sent: list[tuple[int, bool]] = []  # per connection: streams sent, closed by the server

    async def flood() -> None:
        opening = [bodiless_streams(serve.address, pki, 20_000) for _ in range(5)]
        connections.extend(await asyncio.gather(*opening))
        await asyncio.sleep(2)  # held a moment, as by a client that means it
        sent.extend((c.streams, c.draining.done()) for c in connections)
        for opened in connections:
            opened.writer.close()
            opened.draining.cancel()

    async with serve_process(tmp_path, pki) as serve:
        outcome = await under_flood(serve, pki, flood())
    print(f"5 connections x 20,000 bodiless streams: {outcome}; (streams sent, closed) {sent}")
    assert_bounded(outcome)


async def test_refused_clients_idle_connections_are_closed(tmp_path: Path, pki: PKI) -> None:
    intruder = client_ssl_context(pki, client=pki.client("intruder"))
    # The idle timeout sends them GOAWAY; as they never answer its PING, they are closed
    # once a PING's time is up. The wait allows that and the handshakes' time, no more.
    limit = IDLE_TIMEOUT_SECONDS + KEEPALIVE_TIMEOUT_SECONDS + 10
    closed: list[float] = []

    async def one(opened: asyncio.Event) -> None:
        reader, writer = await h2_open(serve.address, intruder)
        opened.set()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await until_closed(reader)
        closed.append(loop.time() - started)
        writer.close()

    async def flood() -> None:
        events = [asyncio.Event() for _ in range(300)]
        connections = [asyncio.create_task(one(event)) for event in events]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 60)
        done, pending = await asyncio.wait(connections, timeout=limit)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()

    async with serve_process(
        tmp_path, pki, tls={**_tls(pki), "allowedClients": ["cluster-autoscaler"]}
    ) as serve:
        outcome = await under_flood(serve, pki, flood())
    after = f"{min(closed, default=0):.0f}-{max(closed, default=0):.0f} s"
    print(f"300 idle refused-client connections: {outcome}; {len(closed)} closed after {after}")
    assert len(closed) == 300, f"{300 - len(closed)} connections still open after {limit} s"
    assert_bounded(outcome)


def _tls(pki: PKI) -> dict[str, str]:
    return {"cert": str(pki.server_cert), "key": str(pki.server_key), "clientCA": str(pki.ca_cert)}
