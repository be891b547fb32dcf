"""Two replicas, one active, both Ready: real `serve` processes electing a leader over a Lease
in a real kube-apiserver, with the service account's RBAC from deploy/; the leader points the
gRPC Service's EndpointSlice at its own Pod and records its creates in the journal's ConfigMap,
which the next leader reads.

Lease timings are short (3 s lease, 2 s renew deadline, 0.5 s retry) so takeovers are quick;
they are config values, the code paths are the production ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import httpx
import pytest
import yaml
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.kube import ENDPOINT_SLICE, LEASE, NAMESPACE, NEEDS_KUBE, Kube
from fixtures.stack import wait_until
from fixtures.tls import PKI, grpc_channel
from fixtures.tools import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kubernetes import client as k8s

from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.service.provider import SERVICE_NAME

pytestmark = [pytest.mark.kube, NEEDS_KUBE]
CLUSTER = "ha"
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 3.0, 2.0, 0.5
RPC_TIMEOUT = 10.0
# Three Lease reads/writes through the API server on loopback.
REQUEST_SLACK = 1.0
# From the moment the gate closes to the test seeing /readyz say so: the poll interval,
# a new HTTP client and the request, on a machine loaded by the replica, the API server and
# etcd. The cut-connection test allows this on top of renewDeadline; it runs with a Lease of
# CUT_LEASE_SECONDS, so a leader that served on until its Lease ran out still fails it.
READY_SLACK = 2.0
CUT_LEASE_SECONDS = 10.0
# The cloud client's timeout in the failover test (its creates take 3 s): a create the last
# leader recorded and no listing showed is counted for twice this (ADOPTED_BOUND_FACTOR).
CLIENT_TIMEOUT_SECONDS = 4.0
GROUP = {"name": "workers", "minSize": 0, "maxSize": 10, "flavor": "flex-4-2",
         "image": "debian-12", "zone": "lpg1"}  # fmt: skip


def lease_api(kube: Kube) -> k8s.CoordinationV1Api:
    return k8s.CoordinationV1Api(kube.client())


async def read_lease(kube: Kube) -> Any:
    return await asyncio.to_thread(lease_api(kube).read_namespaced_lease, LEASE, NAMESPACE)


def ha_config(
    tmp_path: Path,
    name: str,
    pki: PKI,
    emulator: RunningEmulator,
    kube: Kube,
    kubeconfig: Path | None = None,
    lease_seconds: float = LEASE_SECONDS,
    client_timeout: float = 30.0,
    cloud_url: str | None = None,
) -> Path:
    return write_config(
        tmp_path / name, pki, cloud_url or emulator.url, TOKEN, cluster=CLUSTER, groups=[GROUP],
        cloudscale={"maxConcurrentCreates": 2, "timeoutSeconds": client_timeout},
        metrics={"listen": f"127.0.0.1:{free_port()}"},
        kubernetes={
            "kubeconfig": str(kubeconfig or kube.provider_kubeconfig),
            "driftInterval": "0s",
            "leaderElection": {
                "enabled": True, "leaseName": LEASE, "namespace": NAMESPACE,
                "endpointSlice": ENDPOINT_SLICE,
                "leaseDuration": f"{lease_seconds:g}s", "renewDeadline": f"{RENEW_SECONDS:g}s",
                "retryPeriod": f"{RETRY_SECONDS * 1000:g}ms",
            },
        },
    )  # fmt: skip


Replicas = Callable[..., Awaitable[ServeProcess]]


@pytest.fixture
async def replicas(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator, kube: Kube, fresh_election: None
) -> AsyncIterator[Replicas]:
    """`await replicas("replica-a", leader=True)`: a `serve` process with POD_NAME set, once it
    leads (or, by default, once it competes and is Ready); all are killed when the test ends."""
    started: list[ServeProcess] = []

    async def start(
        name: str,
        *,
        leader: bool = False,
        kubeconfig: Path | None = None,
        lease_seconds: float = LEASE_SECONDS,
        client_timeout: float = 30.0,
        cloud_url: str | None = None,
    ) -> ServeProcess:
        config = ha_config(
            tmp_path, name, pki, emulator, kube, kubeconfig, lease_seconds, client_timeout,
            cloud_url,
        )  # fmt: skip
        env = pod_env(name)
        process = await start_serve(config, log_level="info", metrics=True, env=env)
        started.append(process)
        if cloud_url is not None:
            await process.wait_for_output("competes for Lease")  # never Ready: no cloud
        elif leader:
            await eventually(lambda: _leads(process), 30, f"{name} never became the leader")
        else:
            await process.wait_for_output("competes for Lease")
            # Ready once the cloud API answered its start-up check, leader or not.
            await eventually(lambda: _stands_by(process), 30, f"{name} never became Ready")
        return process

    yield start
    for process in started:
        await process.kill()


def pod_env(name: str) -> dict[str, str]:
    """What the chart's downward API tells the replica of Pod `name`."""
    address = f"10.244.0.{sum(name.encode()) % 250 + 2}"
    return {"POD_NAME": name, "POD_NAMESPACE": NAMESPACE, "POD_UID": f"uid-{name}",
            "POD_IP": address}  # fmt: skip


async def ready(process: ServeProcess) -> tuple[int, str]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{process.metrics_port}/readyz")
    return answer.status_code, answer.text


async def leader_gauge(process: ServeProcess) -> float:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{process.metrics_port}/metrics")
    (value,) = [
        float(line.split()[1])
        for line in answer.text.splitlines()
        if line.startswith("cloudscale_autoscaler_leader ")
    ]
    return value


async def call(process: ServeProcess, pki: PKI, rpc: str, request: object) -> Any:
    async with grpc_channel(pki, process.address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        return await getattr(stub, rpc)(request, timeout=RPC_TIMEOUT)


async def health(process: ServeProcess, pki: PKI) -> dict[str, str]:
    """gRPC health per service: a standby is healthy, its CloudProvider entry is not."""
    async with grpc_channel(pki, process.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answers = {}
        for service in ("", SERVICE_NAME):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            answers[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return answers


async def refused(process: ServeProcess, pki: PKI, rpc: str, request: object) -> str:
    """The UNAVAILABLE message a non-serving replica answers `rpc` with."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(process, pki, rpc, request)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    return str(caught.value.details())


async def eventually(condition: Callable[[], Awaitable[bool]], limit: float, what: str) -> float:
    """Seconds until `condition` held."""
    start = time.monotonic()
    await wait_until(condition, limit, what)
    return time.monotonic() - start


def parse_time(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


async def test_standby_takes_over_when_the_leader_dies_during_increase_size(
    replicas: Replicas, pki: PKI, emulator: RunningEmulator, kube: Kube
) -> None:
    a = await replicas("replica-a", leader=True, client_timeout=CLIENT_TIMEOUT_SECONDS)
    b = await replicas("replica-b", client_timeout=CLIENT_TIMEOUT_SECONDS)
    status, text = await ready(b)
    # Ready (it could serve), and says why it does not: the EndpointSlice routes CA.
    assert status == 200 and "standby" in text and "replica-a" in text, text
    message = await refused(b, pki, "NodeGroups", pb.NodeGroupsRequest())
    assert (
        message == f"this replica is a standby (Lease {NAMESPACE}/{LEASE}): the leader is replica-a"
    )
    assert await ready(a) == (200, LEADER)
    assert await health(b, pki) == {"": "SERVING", SERVICE_NAME: "NOT_SERVING"}
    assert await health(a, pki) == {"": "SERVING", SERVICE_NAME: "SERVING"}
    assert (await leader_gauge(a), await leader_gauge(b)) == (1.0, 0.0)

    # Creations held by the API; two in flight (maxConcurrentCreates), two queued.
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 3000}}})
    await call(a, pki, "NodeGroupIncreaseSize",
               pb.NodeGroupIncreaseSizeRequest(id="workers", delta=4))  # fmt: skip

    async def creations_out() -> bool:
        return (await emulator.admin.in_flight()).get("create_server", 0) == 2

    await wait_until(creations_out, 30, "creations did not reach the API")
    renewed = parse_time((await read_lease(kube)).spec.renew_time)
    a.process.kill()  # SIGKILL: no release, no goodbye
    await a.process.wait()
    takeover = await eventually(lambda: _leads(b), 30, "replica-b never took over")
    lease = (await read_lease(kube)).spec
    assert lease.holder_identity == "replica-b"
    assert lease.lease_transitions >= 1
    # B took the Lease once it had not been renewed for leaseDuration (on B's clock, from
    # when B saw the last renewal), never earlier. Later by at most: one more renewal by A
    # after the read above (a retryPeriod), B seeing it (a retryPeriod + 20% jitter), B's
    # next attempt (the same), and the API round trips (REQUEST_SLACK).
    waited = (parse_time(lease.acquire_time) - renewed).total_seconds()
    latest = LEASE_SECONDS + 3.4 * RETRY_SECONDS + REQUEST_SLACK
    assert LEASE_SECONDS - 0.05 <= waited <= latest, waited
    assert takeover < LEASE_SECONDS + 3 * RETRY_SECONDS + RPC_TIMEOUT, takeover

    # B counts A's four creates from the journal: the two the API is carrying out, and the two
    # A never sent. CA, now served by B, has nothing to ask again.
    await call(b, pki, "Refresh", pb.RefreshRequest())
    assert await target_of(b, pki) == 4, b.output
    assert "sent by an earlier process and not listed yet" in b.output
    await emulator.admin.clear_faults()

    async def api_idle() -> bool:
        return not (await emulator.admin.in_flight()).get("create_server", 0)

    await wait_until(api_idle, 30, "the API is still creating")
    assert len(await emulator.admin.servers()) == 2
    # The two A never sent fail once their bound passed; CA deletes them and asks again.
    await eventually(lambda: _failed_instances(b, pki, 2), 4 * CLIENT_TIMEOUT_SECONDS + 10,
                     "the creates A never sent were never given up")  # fmt: skip
    nodes = await call(b, pki, "NodeGroupNodes", pb.NodeGroupNodesRequest(id="workers"))
    placeholders = [i for i in nodes.instances if i.status.errorInfo.errorCode]
    assert {i.status.errorInfo.errorCode for i in placeholders} == {"CREATE_UNCONFIRMED"}
    gone = [pb.ExternalGrpcNode(providerID=i.id, name=i.id) for i in placeholders]
    await call(b, pki, "NodeGroupDeleteNodes",
               pb.NodeGroupDeleteNodesRequest(id="workers", nodes=gone))  # fmt: skip
    assert await target_of(b, pki) == 2
    await call(b, pki, "NodeGroupIncreaseSize",
               pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))  # fmt: skip

    async def four_exist() -> bool:
        return len(await emulator.admin.servers()) == 4 and await api_idle()

    await wait_until(four_exist, 30, "four servers never existed")
    await call(b, pki, "Refresh", pb.RefreshRequest())
    nodes = await call(b, pki, "NodeGroupNodes", pb.NodeGroupNodesRequest(id="workers"))
    servers = await emulator.admin.servers()
    assert len(servers) == 4
    assert len({s["uuid"] for s in servers}) == len({s["name"] for s in servers}) == 4
    for server in servers:
        assert server["tags"][TAG_CLUSTER] == CLUSTER and server["tags"][TAG_GROUP] == "workers"
    assert await target_of(b, pki) == 4
    assert sorted(i.id for i in nodes.instances) == sorted(
        f"cloudscale://{s['uuid']}" for s in servers
    )


async def target_of(process: ServeProcess, pki: PKI) -> int:
    request = pb.NodeGroupTargetSizeRequest(id="workers")
    return int((await call(process, pki, "NodeGroupTargetSize", request)).targetSize)


async def _failed_instances(process: ServeProcess, pki: PKI, count: int) -> bool:
    await call(process, pki, "Refresh", pb.RefreshRequest())
    nodes = await call(process, pki, "NodeGroupNodes", pb.NodeGroupNodesRequest(id="workers"))
    return sum(1 for i in nodes.instances if i.status.errorInfo.errorCode) == count


LEADER = "ready: leader\n"


async def _leads(process: ServeProcess) -> bool:
    if process.process.returncode is not None:
        raise AssertionError(f"replica exited:\n{process.output}")
    return await ready(process) == (200, LEADER)


async def _stands_by(process: ServeProcess) -> bool:
    """Ready, but not serving (it says why)."""
    if process.process.returncode is not None:
        raise AssertionError(f"replica exited:\n{process.output}")
    status, text = await ready(process)
    return status == 200 and text != LEADER


async def test_leader_that_loses_the_lease_stops_serving_at_once(
    replicas: Replicas, pki: PKI, kube: Kube, emulator: RunningEmulator
) -> None:
    a = await replicas("replica-a", leader=True)
    # Two creations held by the API well past the renew deadline, two queued behind them.
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 6000}}})
    await call(a, pki, "NodeGroupIncreaseSize",
               pb.NodeGroupIncreaseSizeRequest(id="workers", delta=4))  # fmt: skip

    def steal() -> None:
        # Right after a renewal: the leader's renew deadline is then as far off as it gets.
        api = lease_api(kube)
        renewed = api.read_namespaced_lease(LEASE, NAMESPACE).spec.renew_time
        while (lease := api.read_namespaced_lease(LEASE, NAMESPACE)).spec.renew_time == renewed:
            time.sleep(0.01)
        lease.spec.holder_identity = "intruder"
        lease.spec.lease_duration_seconds = 600
        lease.spec.renew_time = datetime.now(UTC)
        api.replace_namespaced_lease(LEASE, NAMESPACE, lease)

    await asyncio.to_thread(steal)
    stolen = time.monotonic()

    async def refusing() -> bool:
        try:
            await call(a, pki, "NodeGroupIncreaseSize",
                       pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1))  # fmt: skip
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.UNAVAILABLE
        raise AssertionError("IncreaseSize succeeded after the Lease was taken")

    async def standing_by() -> bool:
        return await _stands_by(a)

    # The leader renews every retryPeriod; the first renewal after the theft sees the
    # intruder and stands by at once, not only when its renew deadline passes.
    await eventually(standing_by, RENEW_SECONDS * 2, "the old leader still serves")
    assert time.monotonic() - stolen < RETRY_SECONDS + REQUEST_SLACK < RENEW_SECONDS
    assert await refusing()
    message = await refused(
        a, pki, "NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id="workers")
    )
    assert "the leader is intruder" in message
    status, text = await ready(a)
    assert status == 200 and "intruder" in text
    assert "lost Lease" in a.output and "could not renew Lease" not in a.output

    # The two sent finish (tagged: the next leader counts them); the queued two never go out,
    # although their slots are free now (they would be sent at once).
    async def two_created() -> bool:
        return len(await emulator.admin.servers()) == 2

    await wait_until(two_created, 30, "the creations in flight never finished")
    await asyncio.sleep(1.0)
    assert (await emulator.admin.in_flight()).get("create_server", 0) == 0
    assert len(await emulator.admin.servers()) == 2
    assert await a.stop(signal.SIGTERM) == 0, a.output
    lease = (await read_lease(kube)).spec
    assert lease.holder_identity == "intruder", "a standby never releases a Lease it does not hold"


async def test_graceful_shutdown_hands_the_lease_over_at_once(
    replicas: Replicas, pki: PKI, kube: Kube
) -> None:
    a = await replicas("replica-a", leader=True)
    b = await replicas("replica-b")
    assert await _stands_by(b)
    assert await a.stop(signal.SIGTERM) == 0, a.output
    assert "released Lease" in a.output
    takeover = await eventually(lambda: _leads(b), 30, "replica-b never took over")
    assert takeover < LEASE_SECONDS, "released, not expired"
    assert (await read_lease(kube)).spec.holder_identity == "replica-b"
    assert await call(b, pki, "NodeGroups", pb.NodeGroupsRequest())


async def leader_status(process: ServeProcess) -> Any:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{process.metrics_port}/status")
    return answer.json()["leader"]


async def test_status_names_this_replica_and_the_lease_holder(replicas: Replicas) -> None:
    a = await replicas("replica-a", leader=True)
    b = await replicas("replica-b")
    lease = f"{NAMESPACE}/{LEASE}"
    assert await leader_status(a) == {
        "lease": lease,
        "identity": "replica-a",
        "leading": True,
        "holder": "replica-a",
    }
    assert await leader_status(b) == {
        "lease": lease,
        "identity": "replica-b",
        "leading": False,
        "holder": "replica-a",
    }
    assert await a.stop(signal.SIGTERM) == 0, a.output
    await eventually(lambda: _leads(b), 30, "replica-b never took over")
    assert (await leader_status(b))["leading"] is True


async def target_and_nodes(process: ServeProcess, pki: PKI) -> tuple[int, list[str]]:
    target = await call(process, pki, "NodeGroupTargetSize",
                        pb.NodeGroupTargetSizeRequest(id="workers"))  # fmt: skip
    nodes = await call(process, pki, "NodeGroupNodes", pb.NodeGroupNodesRequest(id="workers"))
    return target.targetSize, sorted(instance.id for instance in nodes.instances)


async def tagged_servers(emulator: RunningEmulator, count: int) -> list[str]:
    """Provider IDs of `count` new servers of the group, created behind the providers' backs."""
    created = [
        await emulator.admin.create_server(
            f"{CLUSTER}-workers-{i}", tags={TAG_CLUSTER: CLUSTER, TAG_GROUP: "workers"}
        )
        for i in range(count)
    ]
    return [f"cloudscale://{server['uuid']}" for server in created]


async def test_new_leader_serves_the_inventory_it_loaded_at_takeover(
    replicas: Replicas, pki: PKI, emulator: RunningEmulator
) -> None:
    a = await replicas("replica-a", leader=True)
    b = await replicas("replica-b")
    # Servers the standby never listed: it only loads the inventory once it leads.
    existing = await tagged_servers(emulator, 3)
    a.process.kill()
    await a.process.wait()
    await eventually(lambda: _leads(b), 30, "replica-b never took over")
    # The first calls after the takeover, no Refresh before them: what the cloud holds.
    assert await target_and_nodes(b, pki) == (3, sorted(existing))


async def test_leader_regaining_the_lease_while_the_cloud_is_down_waits_for_a_listing(
    replicas: Replicas, pki: PKI, kube: Kube, emulator: RunningEmulator
) -> None:
    a = await replicas("replica-a", leader=True)
    assert await target_and_nodes(a, pki) == (0, [])

    def hand_to(holder: str, seconds: int) -> None:
        api = lease_api(kube)
        lease = api.read_namespaced_lease(LEASE, NAMESPACE)
        lease.spec.holder_identity = holder
        lease.spec.lease_duration_seconds = seconds
        lease.spec.renew_time = datetime.now(UTC)
        api.replace_namespaced_lease(LEASE, NAMESPACE, lease)

    await asyncio.to_thread(hand_to, "intruder", 600)

    async def standing_by() -> bool:
        return await _stands_by(a)

    await eventually(standing_by, RENEW_SECONDS * 2, "replica-a still serves")
    # Meanwhile the cloud changed (as another leader would have changed it), then went down.
    existing = await tagged_servers(emulator, 2)
    await emulator.admin.set_faults({"down": True})
    failures = len(a.output.split("inventory load failed"))
    await asyncio.to_thread(hand_to, "", 1)  # released: replica-a takes the Lease back

    async def holds_it() -> bool:
        return bool((await read_lease(kube)).spec.holder_identity == "replica-a")

    await eventually(holds_it, 30, "replica-a never took the Lease back")

    async def load_failed() -> bool:
        return len(a.output.split("inventory load failed")) > failures

    await eventually(load_failed, 30, "no failed inventory load was logged")
    await asyncio.sleep(4 * RETRY_SECONDS)  # renewals go on: it leads, but must not serve
    assert await _stands_by(a), "serves the inventory of its earlier leadership"
    await refused(a, pki, "NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id="workers"))
    assert (await read_lease(kube)).spec.holder_identity == "replica-a"

    await emulator.admin.clear_faults()
    await eventually(lambda: _leads(a), 30, "replica-a never served after the cloud came back")
    assert await target_and_nodes(a, pki) == (2, sorted(existing))


async def test_a_leader_that_cannot_load_its_inventory_hands_the_lease_to_one_that_can(
    replicas: Replicas, kube: Kube, emulator: RunningEmulator
) -> None:
    """A takes the Lease with a cloud URL nothing answers, so it can never load its inventory
    nor serve. It kept the Lease for ever (no endpoint, no failover) while B could reach the
    API; after three failed loads it releases it and sits a leaseDuration out."""
    a = await replicas("replica-a", cloud_url=f"http://127.0.0.1:{free_port()}/v1")

    async def a_holds() -> bool:
        try:
            return bool((await read_lease(kube)).spec.holder_identity == "replica-a")
        except k8s.ApiException as error:
            if error.status == 404:  # not created yet
                return False
            raise

    await eventually(a_holds, 30, "replica-a never took the Lease")
    b = await replicas("replica-b")
    await eventually(lambda: _leads(b), 120, "replica-b never took over from replica-a")
    assert "gives Lease" in a.output and "could not be loaded 3 times" in a.output


class Cable:
    """A TCP relay to the API server on loopback; `cut()` drops every connection and refuses
    new ones, as an API server that became unreachable does, for this replica only."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        self._writers |= {writer, upstream_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def cut(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()


async def test_leader_that_cannot_reach_the_api_server_stops_serving_by_its_renew_deadline(
    replicas: Replicas, pki: PKI, kube: Kube, tmp_path: Path
) -> None:
    kubeconfig, cable = await _through_cable(kube, tmp_path)
    a = await replicas(
        "replica-a", leader=True, kubeconfig=kubeconfig, lease_seconds=CUT_LEASE_SECONDS
    )
    assert await call(a, pki, "NodeGroups", pb.NodeGroupsRequest())

    cable.cut()
    cut = time.monotonic()

    async def standing_by() -> bool:
        return await _stands_by(a)

    # The last renewal was at most a retryPeriod before the cut; the gate closes when no
    # renewal has succeeded for renewDeadline since, well before the Lease runs out.
    await eventually(standing_by, 30, "the leader still serves without the API server")
    latest = RENEW_SECONDS + READY_SLACK
    assert latest < CUT_LEASE_SECONDS - RETRY_SECONDS  # the Lease's end is not mistaken for it
    assert time.monotonic() - cut < latest
    message = await refused(
        a, pki, "NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id="workers")
    )
    # It knows no other holder: it could not read the Lease.
    assert (
        message == f"this replica is a standby (Lease {NAMESPACE}/{LEASE}): no leader is known yet"
    )
    assert "could not renew Lease" in a.output


async def test_a_leader_cut_off_from_the_api_server_sends_no_create_after_its_renew_deadline(
    replicas: Replicas, pki: PKI, kube: Kube, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """A create the API throttles is retried (429, Retry-After 1) by a leader that then loses
    the API server: it kept retrying for minutes after its Lease lapsed, so a successor that
    had written the create off saw it made later (doubled, past maxSize). No attempt starts
    once its renew deadline passed (the fence), and the create fails NOT_LEADING."""
    kubeconfig, cable = await _through_cable(kube, tmp_path)
    a = await replicas("replica-a", leader=True, kubeconfig=kubeconfig)
    await emulator.admin.set_faults(
        {"rate_limit": {"create_server": {"rate": 1.0, "retry_after": 1}}}
    )
    await call(
        a, pki, "NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1)
    )

    async def throttled_twice() -> bool:
        return sum((await emulator.admin.stats()).get("create_server", {}).values()) >= 2

    await eventually(throttled_twice, 30, "the create was never retried")
    cable.cut()
    await eventually(lambda: _stands_by(a), 30, "the leader still serves without the API server")
    deadline_passed = sum((await emulator.admin.stats()).get("create_server", {}).values())
    await asyncio.sleep(4.0)  # four Retry-After periods
    attempts = sum((await emulator.admin.stats()).get("create_server", {}).values())
    assert attempts <= deadline_passed + 1, "creates sent after the Lease lapsed"
    await eventually(lambda: _said(a, "NOT_LEADING"), 30, "the fenced create never failed")
    assert await emulator.admin.servers() == []


async def _said(process: ServeProcess, text: str) -> bool:
    return text in process.output


async def _through_cable(kube: Kube, tmp_path: Path) -> tuple[Path, Cable]:
    """A kubeconfig reaching the API server through a Cable the test can cut."""
    api = urlsplit(kube.url)
    cable = Cable(api.hostname or "127.0.0.1", api.port or 443)
    await cable.start()
    document = yaml.safe_load(kube.provider_kubeconfig.read_text())
    for entry in document["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{cable.port}"
    kubeconfig = tmp_path / "through-cable.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(document))
    return kubeconfig, cable


async def test_without_leader_election_the_journal_is_the_configmap_a_new_pod_reads(
    pki: PKI,
    emulator: RunningEmulator,
    kube: Kube,
    fresh_election: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One replica with a `kubernetes:` section and no leader election, killed during a
    scale-up and replaced by a new Pod (a new, empty emptyDir): it counts the creates the dead
    one recorded, because the journal is the ConfigMap (it was a file in the emptyDir)."""
    config = write_config(
        tmp_path / "single", pki, emulator.url, TOKEN, cluster=CLUSTER, groups=[GROUP],
        cloudscale={"timeoutSeconds": CLIENT_TIMEOUT_SECONDS},
        kubernetes={"kubeconfig": str(kube.provider_kubeconfig), "driftInterval": "0s",
                    "leaderElection": {"leaseName": LEASE, "namespace": NAMESPACE}},
    )  # fmt: skip
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 3000}}})
    first = await start_serve(config, log_level="info")
    try:
        await call(first, pki, "NodeGroupIncreaseSize",
                   pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))  # fmt: skip

        async def out() -> bool:
            return (await emulator.admin.in_flight()).get("create_server", 0) == 2

        await wait_until(out, 30, "the creates were never sent")
    finally:
        await first.kill()
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "new-pod-emptydir"))
    second = await start_serve(config, log_level="info")
    try:
        assert await target_of(second, pki) == 2, second.output
        assert f"creation journal: ConfigMap {NAMESPACE}/{LEASE}-journal" in second.output
    finally:
        await second.kill()


# --- the gRPC Service's EndpointSlice, which the leader points at its own Pod ----------------


async def routed(kube: Kube) -> list[str]:
    """The Pods the gRPC Service's EndpointSlice lists (what kube-proxy routes CA to)."""

    def names() -> list[str]:
        api = k8s.DiscoveryV1Api(kube.client())
        found = api.read_namespaced_endpoint_slice(ENDPOINT_SLICE, NAMESPACE)
        return [e.target_ref.name for e in found.endpoints or []]

    return await asyncio.to_thread(names)


async def test_the_leader_routes_the_service_to_its_pod_and_the_route_follows_the_lease(
    replicas: Replicas, kube: Kube
) -> None:
    # Left by an earlier run of replica-b's Pod (a leader killed while leading).
    def left() -> None:
        api = k8s.DiscoveryV1Api(kube.client())
        body = {"endpoints": [{"addresses": [pod_env("replica-b")["POD_IP"]],
                               "targetRef": {"kind": "Pod", "namespace": NAMESPACE,
                                             "name": "replica-b"}}]}  # fmt: skip
        api.patch_namespaced_endpoint_slice(ENDPOINT_SLICE, NAMESPACE, body)

    await asyncio.to_thread(left)
    a = await replicas("replica-a", leader=True)
    b = await replicas("replica-b")

    async def only(name: str) -> bool:
        return await routed(kube) == [name]

    await eventually(lambda: only("replica-a"), 10, "the Service does not route to the leader")
    # Both Ready: `helm install --wait` and rollouts finish; the EndpointSlice routes CA.
    assert await ready(a) == (200, LEADER)
    assert await _stands_by(b)
    await asyncio.sleep(4 * RETRY_SECONDS)
    assert await routed(kube) == ["replica-a"], "the standby routed the Service to itself"
    address = pod_env("replica-a")["POD_IP"]

    def endpoint() -> Any:
        api = k8s.DiscoveryV1Api(kube.client())
        return api.read_namespaced_endpoint_slice(ENDPOINT_SLICE, NAMESPACE).endpoints[0]

    listed = await asyncio.to_thread(endpoint)
    assert listed.addresses == [address] and listed.conditions.ready is True
    assert listed.target_ref.uid == "uid-replica-a"

    a.process.kill()  # SIGKILL: the slice still lists it; the new leader replaces it
    await a.process.wait()
    await eventually(lambda: only("replica-b"), LEASE_SECONDS + 5, "the route never moved")
    assert await _leads(b)

    # Shutting down, the leader empties the slice before it releases the Lease.
    assert await b.stop(signal.SIGTERM) == 0, b.output
    assert await routed(kube) == []
    # "emptied", or, when the route's own loop emptied it a moment before (its log line lost
    # to the shutdown's cancellation), the shutdown's attempt finds it no longer lists this Pod.
    listed = b.output.rindex("lists this Pod")
    emptied = max(b.output.find("emptied", listed), b.output.find("does not list this Pod", listed))
    assert listed < emptied < b.output.index("released Lease"), b.output
