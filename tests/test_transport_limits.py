"""The transport stays bounded under any authenticated client: a real `serve` process, flooded
over real mTLS connections, keeps its peak RSS (VmHWM) under the chart's 384 MiB memory limit,
answers a legitimate client within CA's 5 s deadline throughout, and is back within 1.5x of its
idle RSS once the flood is over (the issue allows a minute; the test waits at most that).

The legitimate client is CA's stand-in on its own connection: NodeGroups every 0.2 s, which the
transport answers alone, and alongside, the calls only Python answers (Refresh, NodeGroupNodes,
IncreaseSize and DeleteNodes on its own group, TemplateNodeInfo), each kind several times while
each flood runs.

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
import itertools
import multiprocessing
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, TypeVar

import grpc
import hpack
import httpx
import pytest
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import TOKEN
from fixtures.tls import PKI, client_ssl_context, grpc_channel
from fixtures.tools import cli, free_port

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
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

# The legitimate client scales a group of its own: the first flood's DeleteNodes name "workers".
OWN_GROUP = "legitimate"
GROUP = {"minSize": 0, "maxSize": 3, "flavor": "flex-4-2", "image": "debian-12", "zone": "lpg1"}
GROUPS = [{"name": name, **GROUP} for name in ("workers", OWN_GROUP)]
PYTHON_RPCS = (
    "Refresh",
    "NodeGroupNodes",
    "NodeGroupIncreaseSize",
    "NodeGroupDeleteNodes",
    "NodeGroupTemplateNodeInfo",
)
# Each kind of legitimate call, at least, while each flood runs: a call never made cannot have
# been slow. The shortest flood (40 x 16 MiB, three times) lasted 1 to 5 s here.
MIN_CALLS_IN_FLOOD = 3
T = TypeVar("T")
# The pause after each Python-path call, but for the first BRISK_CALLS of each flood: those come
# back to back, as in a CA loop, so that even the shortest flood sees many rounds while it hits
# hardest. Without pauses (some 300 calls a second; CA makes far fewer) the RSS once stayed at
# 1.6x idle for the whole minute after that flood, and the long flood cost a core for 50 s.
PYTHON_PACE_SECONDS = 0.02
BRISK_CALLS = 50
# How long the server an IncreaseSize started may take to be listed running (the emulator
# boots at once; this only turns a hang into a failure).
RUNNING_LIMIT_SECONDS = 30.0
# The legitimate group's flavor, which the emulator's catalogue changes before each
# TemplateNodeInfo (its memory alternates between these): the Refresh before it reads the flavor
# list again (flavorCacheSeconds 0) and builds the template again, in Python, under the flood.
FLAVOR = "flex-4-2"
FLAVOR_MEMORY_GB = (6, 4)


def status_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@dataclass(frozen=True)
class Call:
    """One legitimate call that answered OK."""

    rpc: str
    started: float  # time.monotonic()
    took: float

    @property
    def ended(self) -> float:
        return self.started + self.took


@dataclass(frozen=True)
class Tally:
    """One RPC's legitimate calls: all, those in the flood (under way at some moment of it),
    the slowest."""

    calls: int
    in_flood: int
    slowest: float

    def __str__(self) -> str:
        return f"{self.calls} ({self.in_flood} in the flood), slowest {self.slowest:.3f} s"


def tally(calls: list[Call], rpc: str, flood: tuple[float, float]) -> Tally:
    mine = [call for call in calls if call.rpc == rpc]
    in_flood = sum(1 for call in mine if call.started <= flood[1] and call.ended >= flood[0])
    return Tally(len(mine), in_flood, max((call.took for call in mine), default=0.0))


@dataclass
class Outcome:
    idle_kib: int
    peak_kib: int
    back_kib: int
    flood_seconds: float
    rpcs: dict[str, Tally]

    def __str__(self) -> str:
        calls = "; ".join(f"{rpc} {calls}" for rpc, calls in self.rpcs.items())
        return (
            f"idle {self.idle_kib // 1024} MiB, peak {self.peak_kib // 1024} MiB, back to "
            f"{self.back_kib // 1024} MiB; flood {self.flood_seconds:.1f} s; legitimate calls: "
            f"{calls}"
        )


@dataclass(frozen=True)
class Client:
    """Where and as whom the legitimate client connects (handed to its process)."""

    address: str
    ca: bytes
    cert: bytes
    key: bytes
    emulator: str  # the emulator's admin API, to change the flavor

    @classmethod
    def of(cls, address: str, pki: PKI, emulator: str) -> Client:
        cert, key = pki.default_client()
        return cls(address, pki.ca_cert.read_bytes(), cert, key, emulator)


@dataclass(frozen=True)
class Signals:
    """Between the test and the legitimate client's process."""

    stop: Event  # by the test when done, by the client when a call failed
    ready: Event  # by the client, once it made a round of the Python-path calls
    flooding: Event  # by the test, while the flood runs


class Legitimate:
    """CA's stand-in on its own connection: NodeGroups every 0.2 s and, alongside, one after
    another, the calls Python answers: IncreaseSize +1 on its own group, Refresh and
    NodeGroupNodes until that server runs, DeleteNodes of it (so the group never fills up),
    TemplateNodeInfo after a change of its flavor (FLAVOR) in the emulator and a Refresh. Runs
    in a process of its own (see under_flood), with gRPC's blocking API, a thread for each of
    the two."""

    def __init__(self, client: Client, signals: Signals) -> None:
        self._emulator = client.emulator
        credentials = grpc.ssl_channel_credentials(client.ca, client.key, client.cert)
        self._channel = grpc.secure_channel(client.address, credentials)
        self._stub = pb_grpc.CloudProviderStub(self._channel)  # type: ignore[no-untyped-call]
        self._signals = signals
        self._brisk = BRISK_CALLS  # calls left to make without a pause in this flood
        self.calls: list[Call] = []  # appended to by both threads
        self.failures: list[str] = []

    def run(self) -> None:
        """Calls until `signals.stop` is set, which a failure does too (see `failures`)."""
        threads = [
            threading.Thread(target=self._until_failure, args=(calling,))
            for calling in (self._node_groups, self._python_path)
        ]
        with self._channel:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    def _until_failure(self, calling: Callable[[], None]) -> None:
        try:
            calling()
        except Exception as error:  # a call that failed or missed CA's deadline, or a bug here
            self.failures.append(str(error) or repr(error))
        finally:
            self._signals.stop.set()  # a failure ends every loop

    def _node_groups(self) -> None:
        while not self._signals.stop.is_set():
            self._timed("NodeGroups", self._stub.NodeGroups, pb.NodeGroupsRequest())
            time.sleep(0.2)

    def _python_path(self) -> None:
        stub = self._stub
        increase = pb.NodeGroupIncreaseSizeRequest(id=OWN_GROUP, delta=1)
        template = pb.NodeGroupTemplateNodeInfoRequest(id=OWN_GROUP)  # CA's own request
        memory = itertools.cycle(FLAVOR_MEMORY_GB)
        while not self._signals.stop.is_set():
            self._python("NodeGroupIncreaseSize", stub.NodeGroupIncreaseSize, increase)
            node = pb.ExternalGrpcNode(providerID=self._running_server())
            delete = pb.NodeGroupDeleteNodesRequest(id=OWN_GROUP, nodes=[node])
            self._python("NodeGroupDeleteNodes", stub.NodeGroupDeleteNodes, delete)
            gb = next(memory)
            changed = httpx.put(f"{self._emulator}/flavors/{FLAVOR}", json={"memory_gb": gb})
            changed.raise_for_status()
            self._python("Refresh", stub.Refresh, pb.RefreshRequest())
            answer = self._python("NodeGroupTemplateNodeInfo", stub.NodeGroupTemplateNodeInfo,
                                  template)  # fmt: skip
            capacity = core_v1_pb2.Node.FromString(answer.nodeBytes).status.capacity["memory"]
            assert capacity.string == f"{gb}Gi", f"template after the change to {gb} GB: {capacity}"
            self._signals.ready.set()

    def _running_server(self) -> str:
        """The providerID of its group's server, once NodeGroupNodes lists it running. Each
        try starts with a Refresh, as CA's loop does: only a listing shows a new server."""
        request = pb.NodeGroupNodesRequest(id=OWN_GROUP)
        deadline = time.monotonic() + RUNNING_LIMIT_SECONDS
        while True:
            self._python("Refresh", self._stub.Refresh, pb.RefreshRequest())
            nodes = self._python("NodeGroupNodes", self._stub.NodeGroupNodes, request)
            for instance in nodes.instances:
                if instance.status.instanceState == pb.InstanceStatus.instanceRunning:
                    return str(instance.id)
            assert time.monotonic() < deadline, f"no server of {OWN_GROUP} running: {nodes}"

    def _python(self, rpc: str, method: Callable[..., T], request: Any) -> T:
        """A call only Python answers, then a pause (see PYTHON_PACE_SECONDS)."""
        answer = self._timed(rpc, method, request)
        if not self._signals.flooding.is_set():
            self._brisk = BRISK_CALLS
        elif self._brisk > 0:
            self._brisk -= 1
            return answer
        time.sleep(PYTHON_PACE_SECONDS)
        return answer

    def _timed(self, rpc: str, method: Callable[..., T], request: Any) -> T:
        """`method(request)` with CA's deadline, recorded; a failure names the RPC."""
        started = time.monotonic()
        try:
            answer = method(request, timeout=CA_DEADLINE)
        except grpc.RpcError as error:
            took = time.monotonic() - started
            raise AssertionError(
                f"legitimate {rpc}: {error.code().name} after {took:.2f} s: {error.details()}"
            ) from None
        self.calls.append(Call(rpc, started, time.monotonic() - started))
        return answer


def call_legitimately(client: Client, signals: Signals, results: Connection) -> None:
    """The legitimate client's process: calls until `signals.stop`, then sends back its calls
    and its first failure (None without one)."""
    legitimate = Legitimate(client, signals)
    legitimate.run()
    results.send((legitimate.calls, next(iter(legitimate.failures), None)))


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


async def under_flood(
    serve: ServeProcess, pki: PKI, flood: Awaitable[None], emulator: str
) -> Outcome:
    """Runs `flood` against `serve` with a legitimate client calling throughout; the
    process's memory before, at its peak during, and after it."""
    pid = serve.process.pid
    # The legitimate client runs in a process of its own, as CA does: the floods' clients keep
    # this one busy (a round of 40 x 16 MiB holds its event loop and its GIL for half a second
    # at a time), which a client in it would spend waiting, not calling. Spawned: gRPC does
    # not survive a fork.
    spawn = multiprocessing.get_context("spawn")
    signals = Signals(stop=spawn.Event(), ready=spawn.Event(), flooding=spawn.Event())
    results, sending = spawn.Pipe(duplex=False)
    client = Client.of(serve.address, pki, emulator)
    legitimate = spawn.Process(target=call_legitimately, args=(client, signals, sending))
    legitimate.start()
    sending.close()  # its end is the child's: recv fails if the child dies without answering
    try:
        # Connected, and a round of Python-path calls made: the answers' memory is in place.
        while not signals.ready.is_set():
            if signals.stop.is_set() or not legitimate.is_alive():  # its failure follows
                raise AssertionError("the legitimate client stopped before the flood")
            await asyncio.sleep(0.1)
        idle_kib = status_kib(pid, "VmRSS")
        with open(f"/proc/{pid}/clear_refs", "w") as clear:  # noqa: ASYNC230 (procfs)
            clear.write("5")  # VmHWM from now on
        signals.flooding.set()
        flood_started = time.monotonic()
        flooding = asyncio.ensure_future(flood)
        watching = asyncio.create_task(watch_rss(pid, flooding))
        with contextlib.suppress(asyncio.CancelledError):
            await flooding
        flood_window = (flood_started, time.monotonic())
        signals.flooding.clear()
        await watching
        peak_kib = status_kib(pid, "VmHWM")
        back_kib = await back_to_idle(pid, idle_kib)
    finally:
        signals.stop.set()
        calls, failure = await asyncio.to_thread(results.recv)
        await asyncio.to_thread(legitimate.join)
        assert failure is None, failure  # a legitimate call failed or missed CA's deadline
    rpcs = {rpc: tally(calls, rpc, flood_window) for rpc in ("NodeGroups", *PYTHON_RPCS)}
    return Outcome(idle_kib, peak_kib, back_kib, flood_window[1] - flood_window[0], rpcs)


def assert_bounded(outcome: Outcome) -> None:
    assert outcome.peak_kib < CHART_LIMIT_KIB, f"over the chart's 384 MiB: {outcome}"
    for rpc, calls in outcome.rpcs.items():
        assert calls.slowest < CA_DEADLINE, f"{rpc} slower than CA's deadline: {outcome}"
        assert calls.in_flood >= MIN_CALLS_IN_FLOOD, f"too few {rpc} in the flood: {outcome}"
    assert outcome.back_kib <= 1.5 * outcome.idle_kib, f"not back near idle: {outcome}"


@contextlib.asynccontextmanager
async def serve_process(
    tmp_path: Path, pki: PKI, **top: Any
) -> AsyncIterator[tuple[ServeProcess, str]]:
    """`serve` with the floods' config, and the admin API of the emulator it calls."""
    async with emulator_process(tmp_path) as api_url:
        config = write_config(tmp_path, pki, api_url, TOKEN, cluster="flood", groups=GROUPS,
                              cloudscale={"flavorCacheSeconds": 0}, **top)  # fmt: skip
        serve = await start_serve(config, log_level="info")
        try:
            yield serve, api_url.removesuffix("/v1") + "/_emulator"
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

    async with serve_process(tmp_path, pki) as (serve, emulator):
        options = [("grpc.max_send_message_length", 32 * MIB)]
        async with grpc_channel(pki, serve.address, options=options) as channel:
            outcome = await under_flood(serve, pki, flood(channel), emulator)
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

    async with serve_process(tmp_path, pki) as (serve, emulator):
        outcome = await under_flood(serve, pki, flood(), emulator)
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
    ) as (serve, emulator):
        outcome = await under_flood(serve, pki, flood(), emulator)
    after = f"{min(closed, default=0):.0f}-{max(closed, default=0):.0f} s"
    print(f"300 idle refused-client connections: {outcome}; {len(closed)} closed after {after}")
    assert len(closed) == 300, f"{300 - len(closed)} connections still open after {limit} s"
    assert_bounded(outcome)


def _tls(pki: PKI) -> dict[str, str]:
    return {"cert": str(pki.server_cert), "key": str(pki.server_key), "clientCA": str(pki.ca_cert)}
