"""Kubernetes Events against a real kube-apiserver, written with the service account's RBAC
from deploy/: real `serve` processes over real gRPC, told their Pod by the downward API's
variables, backed by the emulator; Events read back as `kubectl describe` finds them (by the
object's uid).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.kube import NAMESPACE, NEEDS_KUBE, Kube
from fixtures.stack import wait_until
from fixtures.tls import PKI, grpc_channel
from fixtures.tools import free_port
from kubernetes import client as k8s

from cloudscale_autoscaler.cloud.errors import QuotaExceededError
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP
from cloudscale_autoscaler.kube.api import KubeApi, load_client
from cloudscale_autoscaler.kube.events import REPEAT_SECONDS, Regarding
from cloudscale_autoscaler.kube.recorder import EventRecorder
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.service.serving import Serving

pytestmark = [pytest.mark.kube, NEEDS_KUBE]
CLUSTER = "events"
LEASE = "cloudscale-autoscaler"  # the one name deploy/'s Role lets the provider update
GROUP = {"name": "workers", "minSize": 0, "maxSize": 3000, "flavor": "flex-4-2",
         "image": "debian-12", "zone": "lpg1"}  # fmt: skip
QUOTA_TEXT = "Quota exceeded: servers (limit 0, in use 0)."
STORM = 1000
WAIT_SECONDS = 30.0


@pytest.fixture
async def pod(kube: Kube) -> AsyncIterator[Regarding]:
    """A Pod object for the replica (nothing runs it: the replica is a `serve` process told
    its name, namespace and uid, as the chart's downward API tells the container)."""
    api = k8s.CoreV1Api(kube.client())
    name = f"provider-{uuid.uuid4().hex[:8]}"

    def create() -> str:
        with contextlib.suppress(k8s.ApiException):  # the apiserver alone makes no accounts
            api.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
        body = {
            "metadata": {"name": name},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [{"name": "provider", "image": "cloudscale-autoscaler"}],
            },
        }
        return str(api.create_namespaced_pod(NAMESPACE, body).metadata.uid)

    uid = await asyncio.to_thread(create)
    yield Regarding("Pod", name, NAMESPACE, uid)
    await asyncio.to_thread(api.delete_namespaced_pod, name, NAMESPACE, grace_period_seconds=0)


def env_of(pod: Regarding) -> dict[str, str]:
    return {"POD_NAME": pod.name, "POD_NAMESPACE": pod.namespace, "POD_UID": pod.uid}


async def events_about(kube: Kube, regarding: Regarding, reason: str) -> list[Any]:
    """The Events `kubectl describe` shows for the object, of `reason`."""
    selector = (
        f"involvedObject.kind={regarding.kind},involvedObject.name={regarding.name},"
        f"involvedObject.uid={regarding.uid},reason={reason}"
    )
    api = k8s.CoreV1Api(kube.client())
    found = await asyncio.to_thread(
        api.list_namespaced_event, regarding.event_namespace, field_selector=selector
    )
    return list(found.items)


async def one_event(
    kube: Kube, regarding: Regarding, reason: str, done: Callable[[Any], bool] = lambda _: True
) -> Any:
    """The one Event of `reason` about the object, once `done(event)` holds; fails on two."""
    seen: list[Any] = []

    async def present() -> bool:
        seen[:] = await events_about(kube, regarding, reason)
        assert len(seen) <= 1, [(e.metadata.name, e.count, e.message) for e in seen]
        return len(seen) == 1 and done(seen[0])

    await wait_until(present, WAIT_SECONDS, f"no {reason} Event about {regarding}: {seen}")
    return seen[0]


def events_config(
    tmp_path: Path,
    pki: PKI,
    emulator: RunningEmulator,
    kubeconfig: Path,
    election: dict[str, Any] | None = None,
) -> Path:
    kubernetes: dict[str, Any] = {"kubeconfig": str(kubeconfig), "driftInterval": "0s"}
    if election is not None:
        kubernetes["leaderElection"] = election
    return write_config(
        tmp_path, pki, emulator.url, TOKEN, cluster=CLUSTER, groups=[GROUP],
        cloudscale={"maxConcurrentCreates": 2},
        metrics={"listen": f"127.0.0.1:{free_port()}"},
        kubernetes=kubernetes,
    )  # fmt: skip


Serve = Callable[..., Awaitable[ServeProcess]]


@pytest.fixture
async def serve(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator, fresh_election: None
) -> AsyncIterator[Serve]:
    """`await serve(kubeconfig, env, election=None)`: a `serve` process; killed at the end.
    With or without leader election its journal is the namespace's ConfigMap, shared with
    every test of this worker's apiserver: emptied before and after (a record another
    cluster's test left made IncreaseSize refuse: a foreign journal)."""
    started: list[ServeProcess] = []

    async def start(
        kubeconfig: Path, env: dict[str, str], election: dict[str, Any] | None = None
    ) -> ServeProcess:
        config = events_config(tmp_path / f"serve-{len(started)}", pki, emulator, kubeconfig,
                               election)  # fmt: skip
        process = await start_serve(config, log_level="info", metrics=True, env=env)
        started.append(process)
        return process

    yield start
    for process in started:
        await process.kill()


async def increase(process: ServeProcess, pki: PKI, delta: int, deadline: float = 30) -> None:
    async with grpc_channel(pki, process.address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        request = pb.NodeGroupIncreaseSizeRequest(id="workers", delta=delta)
        await stub.NodeGroupIncreaseSize(request, timeout=deadline)


# CA's default per-RPC timeout (cloud-config grpc_timeout).
CA_DEADLINE = 5.0


async def metric(process: ServeProcess, name: str, labels: str = "") -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{process.metrics_port}/metrics")).text
    pattern = rf"^{re.escape(name + labels)} (\S+)$"
    values = [float(m.group(1)) for m in re.finditer(pattern, text, re.MULTILINE)]
    assert len(values) == 1, f"{name}{labels} not in:\n{text}"
    return values[0]


# --- a refusal storm is one Event -----------------------------------------------------------


async def test_a_quota_refusal_storm_is_one_event_on_the_providers_pod(
    serve: Serve, pod: Regarding, kube: Kube, pki: PKI, emulator: RunningEmulator
) -> None:
    provider = await serve(kube.provider_kubeconfig, env_of(pod))
    await emulator.admin.set_faults({"quota": {"max_servers": 0}})
    await increase(provider, pki, STORM)  # every placeholder refused: OutOfResources for CA

    event = await one_event(kube, pod, "CreationRefused", lambda e: e.count >= STORM)
    assert event.count == STORM, "one per refused server, each counted once"
    assert event.type == "Warning"
    assert event.metadata.namespace == NAMESPACE
    assert event.involved_object.name == pod.name and event.involved_object.kind == "Pod"
    assert event.message == (
        "node group workers: the cloud API refused to create a server (QUOTA_EXCEEDED): "
        f"create_server: HTTP 400: {QUOTA_TEXT}"
    )
    assert event.source.component == "cloudscale-autoscaler"

    # CA tries again later: a second Event with the count since the first (the account may
    # create Events, never change one), the first left as it was.
    await increase(provider, pki, STORM // 2)
    seen: list[Any] = []

    async def two() -> bool:
        seen[:] = await events_about(kube, pod, "CreationRefused")
        return len(seen) == 2

    await wait_until(two, WAIT_SECONDS + REPEAT_SECONDS, f"no second Event: {seen}")
    first, again = sorted(seen, key=lambda e: e.metadata.creation_timestamp)
    assert (first.metadata.name, first.count) == (event.metadata.name, STORM)
    assert again.count == STORM // 2
    assert again.first_timestamp >= event.last_timestamp
    ok = '{result="ok"}'
    assert await metric(provider, "cloudscale_autoscaler_kube_event_writes_total", ok) == 2
    assert await metric(provider, "cloudscale_autoscaler_kube_events_dropped_total") == 0


# --- a failed deletion is an Event on its Node ----------------------------------------------


async def test_a_failed_deletion_is_an_event_on_the_node(
    serve: Serve, pod: Regarding, kube: Kube, pki: PKI, emulator: RunningEmulator
) -> None:
    provider = await serve(kube.provider_kubeconfig, env_of(pod))
    server = await emulator.admin.create_server(
        f"{CLUSTER}-workers-x", tags={TAG_CLUSTER: CLUSTER, TAG_GROUP: "workers"}, zone="lpg1"
    )
    node_name = f"node-{uuid.uuid4().hex[:8]}"
    await emulator.admin.set_faults({"error_rate": {"delete_server": {"rate": 1.0,
                                                                      "status": 403}}})  # fmt: skip
    async with grpc_channel(pki, provider.address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        await stub.Refresh(pb.RefreshRequest(), timeout=30)
        node = pb.ExternalGrpcNode(name=node_name, providerID=f"cloudscale://{server['uuid']}")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.NodeGroupDeleteNodes(
                pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node]), timeout=30
            )
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE

    # kubectl describe node: the kubelet's convention, uid = the Node's name.
    regarding = Regarding("Node", node_name, uid=node_name)
    event = await one_event(kube, regarding, "DeletionFailed")
    assert event.metadata.namespace == "default"
    assert event.type == "Warning" and event.count == 1
    assert event.message == (
        f"node group workers: deleting server {server['uuid']} failed (AUTHENTICATION_FAILED): "
        "delete_server: HTTP 403: Emulated error (HTTP 403)."
    )


# --- leadership -------------------------------------------------------------------------------


@pytest.fixture
def lease_api(kube: Kube, fresh_election: None) -> k8s.CoordinationV1Api:
    """No Lease or journal left from another test (they share the apiserver and the names)."""
    return k8s.CoordinationV1Api(kube.client())


async def test_a_missing_lease_is_waited_for_and_taken_once_the_install_makes_it(
    serve: Serve, pod: Regarding, kube: Kube, lease_api: k8s.CoordinationV1Api
) -> None:
    """The account may not create Leases (the install does): with its Lease deleted a
    replica keeps running, says once why it cannot lead, and leads once the Lease is back."""
    await asyncio.to_thread(lease_api.delete_namespaced_lease, LEASE, NAMESPACE)
    election = {"enabled": True, "leaseName": LEASE, "namespace": NAMESPACE,
                "leaseDuration": "3s", "renewDeadline": "2s", "retryPeriod": "500ms"}  # fmt: skip
    replica = await serve(kube.provider_kubeconfig, env_of(pod), election)
    missing = "does not exist, and this account may not create it"
    await replica.wait_for_output(missing)
    await asyncio.sleep(3)  # six more attempts, every retryPeriod
    assert replica.process.returncode is None, replica.output
    assert replica.output.count(missing) == 1, replica.output
    assert not await events_about(kube, pod, "LeadershipGained")
    await asyncio.to_thread(
        lease_api.create_namespaced_lease, NAMESPACE, {"metadata": {"name": LEASE}}
    )
    gained = await one_event(kube, pod, "LeadershipGained")
    assert gained.count == 1


async def test_leadership_gained_and_lost_are_events_on_the_replicas_pod(
    serve: Serve, pod: Regarding, kube: Kube, lease_api: k8s.CoordinationV1Api
) -> None:
    election = {"enabled": True, "leaseName": LEASE, "namespace": NAMESPACE,
                "leaseDuration": "3s", "renewDeadline": "2s", "retryPeriod": "500ms"}  # fmt: skip
    await serve(kube.provider_kubeconfig, env_of(pod), election)
    gained = await one_event(kube, pod, "LeadershipGained")
    assert gained.type == "Normal" and gained.count == 1
    assert gained.message == (
        f"{pod.name} leads (Lease {NAMESPACE}/{LEASE}) and serves the CloudProvider RPCs"
    )

    def steal() -> None:
        lease = lease_api.read_namespaced_lease(LEASE, NAMESPACE)
        lease.spec.holder_identity = "intruder"
        lease.spec.lease_duration_seconds = 600
        lease.spec.renew_time = datetime.now(UTC)
        lease_api.replace_namespaced_lease(LEASE, NAMESPACE, lease)

    await asyncio.to_thread(steal)
    lost = await one_event(kube, pod, "LeadershipLost")
    assert lost.type == "Warning"
    assert lost.message == (
        f"{pod.name} stopped serving the CloudProvider RPCs: this replica is a standby "
        f"(Lease {NAMESPACE}/{LEASE}): the leader is intruder"
    )


async def test_only_the_serving_replica_records_what_the_engine_reports(
    pod: Regarding, kube: Kube
) -> None:
    """A standby's observations are not written (the leader tells the story); its own
    leadership change is."""
    api = KubeApi(await asyncio.to_thread(load_client, kube.provider_kubeconfig))
    serving = Serving(f"{NAMESPACE}/{LEASE}")  # a standby until serve_until
    recorder = EventRecorder(api, serving, pod)
    writer = asyncio.create_task(recorder.run())
    refusal = QuotaExceededError(QUOTA_TEXT, 400, "create_server")
    try:
        recorder.creation_failed("workers", refusal)
        serving.serve_until(math.inf)  # leads: LeadershipGained
        await one_event(kube, pod, "LeadershipGained")
        assert await events_about(kube, pod, "CreationRefused") == [], "recorded as a standby"
        recorder.creation_failed("workers", refusal)
        refused = await one_event(kube, pod, "CreationRefused")
        assert refused.count == 1, "only the refusal seen while serving"
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        await asyncio.to_thread(api.close)


# --- an API server that refuses or hangs never holds up an RPC -------------------------------


async def test_an_api_server_refusing_everything_is_a_clear_answer_and_one_log_line(
    serve: Serve, pod: Regarding, kube: Kube, pki: PKI, tmp_path: Path
) -> None:
    """An authenticated user without any RBAC binding: every write is 403 Forbidden. The
    creation journal is the namespace's ConfigMap, so IncreaseSize says it cannot read it (no
    create unrecorded); the Event writes refused are logged once."""
    provider = await serve(kube.nobody_kubeconfig, env_of(pod))
    with pytest.raises(grpc.aio.AioRpcError) as refused_journal:
        await increase(provider, pki, 10)
    assert refused_journal.value.code() == grpc.StatusCode.UNAVAILABLE
    details = refused_journal.value.details() or ""
    assert "cannot claim the creation journal" in details and "403" in details, details
    error = '{result="error"}'
    for attempt in range(2):  # two refused reloads, two Events written in vain
        config = tmp_path / "serve-0" / "config.yaml"
        max_size = -1 - attempt
        rewrite(config, lambda doc, size=max_size: doc["nodeGroups"][0].update(maxSize=size))

        async def refused(count: int = attempt + 1) -> bool:
            writes = "cloudscale_autoscaler_kube_event_writes_total"
            return await metric(provider, writes, error) >= count

        await wait_until(refused, WAIT_SECONDS, "no Event write was refused")
    warnings = [line for line in provider.output.splitlines() if "events: writing Event" in line]
    assert len(warnings) == 1, warnings
    assert "ConfigReloadRefused about Pod" in warnings[0] and "403" in warnings[0], warnings
    assert await events_about(kube, pod, "ConfigReloadRefused") == []


class BlackHole:
    """An "API server" that accepts connections and reads requests but never answers."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.open = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            self.requests.append((await reader.readline()).decode(errors="replace").strip())
            await reader.read()  # until the client gives up and closes
        finally:
            self.open -= 1
            writer.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def test_an_api_server_that_never_answers_does_not_hold_up_increase_size(
    serve: Serve, pod: Regarding, kube: Kube, pki: PKI, emulator: RunningEmulator,
    tmp_path: Path,
) -> None:  # fmt: skip
    hole = BlackHole()
    await hole.start()
    document = yaml.safe_load(kube.provider_kubeconfig.read_text())
    for entry in document["clusters"]:
        entry["cluster"] = {"server": f"http://127.0.0.1:{hole.port}"}
    kubeconfig = tmp_path / "black-hole.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(document))
    try:
        provider = await serve(kubeconfig, env_of(pod))
        rewrite(tmp_path / "serve-0" / "config.yaml",
                lambda doc: doc["nodeGroups"][0].update(maxSize=-1))  # fmt: skip

        async def held() -> bool:
            return hole.open > 0 and any("/events" in r for r in hole.requests)

        await wait_until(held, WAIT_SECONDS, f"no Event write reached the API: {hole.requests}")
        # The write hangs; IncreaseSize answers within CA's deadline anyway: UNAVAILABLE, as
        # the journal's ConfigMap is behind the same hole (no create goes out unrecorded).
        with pytest.raises(grpc.aio.AioRpcError) as answered:
            await increase(provider, pki, 10, deadline=CA_DEADLINE)
        assert answered.value.code() == grpc.StatusCode.UNAVAILABLE, answered.value
        assert hole.open > 0, "the Event write was no longer held when IncreaseSize answered"
        assert any(
            r.startswith(f"POST /api/v1/namespaces/{NAMESPACE}/events ") for r in hole.requests
        )
    finally:
        hole.close()


# --- config reloads ---------------------------------------------------------------------------


def rewrite(config: Path, change: Callable[[dict[str, Any]], None]) -> None:
    document = yaml.safe_load(config.read_text())
    change(document)
    new = config.with_suffix(".new")
    new.write_text(yaml.safe_dump(document))
    new.replace(config)


async def test_a_refused_reload_and_a_removed_group_are_events_on_the_replicas_pod(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator, kube: Kube, pod: Regarding
) -> None:
    config = events_config(tmp_path, pki, emulator, kube.provider_kubeconfig)
    process = await start_serve(config, log_level="info", env=env_of(pod))
    try:
        rewrite(config, lambda doc: doc["nodeGroups"][0].update(maxSize=-1))
        refused = await one_event(kube, pod, "ConfigReloadRefused")
        assert refused.type == "Warning"
        assert refused.message == (
            "config reload refused, the running configuration is kept: "
            "nodeGroups[0].maxSize: must be >= 0, got -1"
        )
        rewrite(config, lambda doc: doc["nodeGroups"][0].update(name="other", maxSize=3))
        removed = await one_event(kube, pod, "NodeGroupRemoved")
        assert removed.type == "Warning"
        assert removed.message == (
            "node group workers is no longer configured: 0 server(s), 0 create(s) sent before "
            "the reload and 0 managed server group(s) of it are kept and no longer served (a "
            "reload never deletes a server)"
        )
    finally:
        await process.kill()


# --- the metrics, as documented ----------------------------------------------------------------

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def documented_metrics() -> set[str]:
    """The names in docs/operations.md's metrics table (`a_{x,y}` spelled out)."""
    names: set[str] = set()
    for cell in re.findall(r"^\| `(cloudscale_autoscaler_[^`]+)` \|", OPERATIONS.read_text(),
                           re.MULTILINE):  # fmt: skip
        if match := re.fullmatch(r"(.*)\{([^}]+)\}(.*)", cell):
            names |= {match[1] + part + match[3] for part in match[2].split(",")}
        else:
            names.add(cell)
    return names


async def test_every_metric_exported_is_documented_and_every_documented_one_exported(
    serve: Serve, pod: Regarding, kube: Kube, pki: PKI, tmp_path: Path
) -> None:
    """A replica with every part that exports metrics (the Kubernetes side, drift checks,
    Events, reloads), scraped once it served calls of each kind."""
    provider = await serve(kube.provider_kubeconfig, env_of(pod))
    with contextlib.suppress(grpc.aio.AioRpcError):
        await increase(provider, pki, 1)
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{provider.metrics_port}/metrics")).text
    exported = set()
    for name, kind in re.findall(r"^# TYPE (cloudscale_autoscaler_\S+) (\S+)$", text, re.MULTILINE):
        if name.endswith("_created"):  # prometheus_client's creation time of a counter
            continue
        counter = kind == "counter" and not name.endswith("_total")
        exported.add(name + "_total" if counter else name)
    documented = documented_metrics()
    assert exported - documented == set(), "exported, not in docs/operations.md"
    assert documented - exported == set(), "documented, not exported"
