"""The Helm chart and the kustomize base installed into a real control plane (kube-apiserver,
kube-controller-manager, kube-scheduler, kwok Nodes; tests/fixtures/cluster.py), as a platform
engineer installs them: `helm install --wait` and a rollout that completes with two replicas.

kwok's Pods run nothing: the replicas are two real `serve` processes outside the Pods, each
told its Pod's name and address, so the real election and routing code decides what the gRPC
Service's EndpointSlice lists: the leader's Pod alone, and after the leader is killed, the new
leader's.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.cluster import Cluster, cert_manager_crds, condition_true, running_cluster
from fixtures.deployed import rollout_complete
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.kube import NEEDS_KUBE, running_kube
from fixtures.stack import wait_until
from fixtures.tls import PKI
from fixtures.tools import HELM, KUSTOMIZE, ensure, free_port
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError

pytestmark = [pytest.mark.kube, NEEDS_KUBE]

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "cloudscale-autoscaler"
KUSTOMIZE_BASE = ROOT / "deploy" / "kustomize" / "base"
NAMESPACE = "autoscaling"
RELEASE = "ha"
FULLNAME = f"{RELEASE}-cloudscale-autoscaler"
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 4, 3, 1
INSTALL_LIMIT_SECONDS = 180
ENDPOINT_SLACK_SECONDS = 5  # the acceptance bound: leaseDuration + this


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Its own control plane: kube-controller-manager must not touch other tests' Nodes."""
    with (
        tempfile.TemporaryDirectory(prefix="cluster-") as directory,
        running_kube(Path(directory)) as kube,
        running_cluster(kube, Path(directory)) as running,
    ):
        crds = cert_manager_crds(ensure(HELM))
        with kube.client() as api:
            for crd in crds:
                k8s_utils.create_from_dict(api, crd)
            k8s.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        _wait_established(running, [crd["metadata"]["name"] for crd in crds])
        yield running


def _wait_established(cluster: Cluster, names: list[str]) -> None:
    api = k8s.ApiextensionsV1Api(cluster.kube.client())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(
            condition_true(api.read_custom_resource_definition(name).status, "Established")
            for name in names
        ):
            return
        time.sleep(0.5)
    raise AssertionError(f"cert-manager's CRDs were not established: {names}")


async def wait_rollout(cluster: Cluster, namespace: str, name: str, limit: float) -> None:
    apps = k8s.AppsV1Api(cluster.kube.client())

    async def complete() -> bool:
        deployment = await asyncio.to_thread(apps.read_namespaced_deployment, name, namespace)
        return rollout_complete(deployment)

    await wait_until(complete, limit, f"the rollout of {namespace}/{name} never completed")


async def endpoint_pods(cluster: Cluster, service: str) -> list[str]:
    """The Pods the Service's EndpointSlices list (ready endpoints)."""
    discovery = k8s.DiscoveryV1Api(cluster.kube.client())
    slices = await asyncio.to_thread(
        discovery.list_namespaced_endpoint_slice,
        NAMESPACE,
        label_selector=f"kubernetes.io/service-name={service}",
    )
    return sorted(
        endpoint.target_ref.name
        for found in slices.items
        for endpoint in found.endpoints or []
        if endpoint.target_ref is not None and (endpoint.conditions.ready is not False)
    )


def service_account_kubeconfig(cluster: Cluster, tmp_path: Path) -> Path:
    """A kubeconfig with a token for the chart's service account: its RBAC is what's tested."""
    token = (
        cluster.core()
        .create_namespaced_service_account_token(
            FULLNAME, NAMESPACE, {"spec": {"expirationSeconds": 3600}}
        )
        .status.token
    )
    document = yaml.safe_load(cluster.kube.admin_kubeconfig.read_text())
    for user in document["users"]:
        user["user"] = {"token": token}
    path = tmp_path / "provider.kubeconfig"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
async def replicas(
    cluster: Cluster, installed: float, tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> AsyncIterator[dict[str, ServeProcess]]:
    """After `helm install`: one `serve` process per Pod of the release, told its Pod's name."""
    # No replica leads yet: the EndpointSlice the chart made lists no Pod.
    assert await endpoint_pods(cluster, FULLNAME) == []
    pods = await asyncio.to_thread(
        cluster.core().list_namespaced_pod,
        NAMESPACE,
        label_selector=f"app.kubernetes.io/instance={RELEASE}",
    )
    kubeconfig = service_account_kubeconfig(cluster, tmp_path)
    started: dict[str, ServeProcess] = {}
    try:
        for pod in pods.items:
            name = pod.metadata.name
            config = write_config(
                tmp_path / name, pki, emulator.url, TOKEN, cluster="install",
                groups=[{"name": "workers", "minSize": 0, "maxSize": 3, "flavor": "flex-4-2",
                         "image": "debian-12", "zone": "lpg1"}],
                metrics={"listen": f"127.0.0.1:{free_port()}"},
                kubernetes={
                    "kubeconfig": str(kubeconfig), "driftInterval": "0s",
                    "leaderElection": {
                        "enabled": True, "leaseName": FULLNAME, "namespace": NAMESPACE,
                        "endpointSlice": FULLNAME, "journalConfigMap": f"{FULLNAME}-journal",
                        "leaseDuration": f"{LEASE_SECONDS}s", "renewDeadline": f"{RENEW_SECONDS}s",
                        "retryPeriod": f"{RETRY_SECONDS}s",
                    },
                },
            )  # fmt: skip
            env = {"POD_NAME": name, "POD_NAMESPACE": NAMESPACE, "POD_UID": pod.metadata.uid,
                   "POD_IP": pod.status.pod_ip}  # fmt: skip
            started[name] = await start_serve(config, log_level="info", metrics=True, env=env)
        yield started
    finally:
        for process in started.values():
            await process.kill()


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> float:
    """`helm install --wait` of the chart (short Lease timings); the seconds it took."""
    began = time.monotonic()
    done = _run(
        [ensure(HELM), "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait",
         "--timeout", f"{INSTALL_LIMIT_SECONDS}s",
         "--kubeconfig", str(cluster.kube.admin_kubeconfig),
         "--set", f"kubernetes.leaderElection.leaseDuration={LEASE_SECONDS}s",
         "--set", f"kubernetes.leaderElection.renewDeadline={RENEW_SECONDS}s",
         "--set", f"kubernetes.leaderElection.retryPeriod={RETRY_SECONDS}s"],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return time.monotonic() - began


async def test_helm_install_waits_for_two_ready_replicas(
    cluster: Cluster, installed: float
) -> None:
    assert installed < INSTALL_LIMIT_SECONDS
    await wait_rollout(cluster, NAMESPACE, FULLNAME, 30)
    pods = await asyncio.to_thread(
        cluster.core().list_namespaced_pod, NAMESPACE,
        label_selector=f"app.kubernetes.io/instance={RELEASE}",
    )  # fmt: skip
    assert len(pods.items) == 2
    assert len({pod.spec.node_name for pod in pods.items}) == 2, "one replica per node"
    replicas = sorted(pod.metadata.name for pod in pods.items)

    async def both_scraped() -> bool:
        # The EndpointSlice controller follows Pod readiness a moment later.
        return sorted(await endpoint_pods(cluster, f"{FULLNAME}-metrics")) == replicas

    await wait_until(both_scraped, 30, "the metrics Service never listed both replicas")
    print(f"helm install --wait: {installed:.1f}s")


async def test_the_grpc_service_lists_the_leader_alone_and_follows_a_failover(
    cluster: Cluster, replicas: dict[str, ServeProcess]
) -> None:
    assert len(replicas) == 2
    lease_api = k8s.CoordinationV1Api(cluster.kube.client())

    async def holder() -> str:
        lease = await asyncio.to_thread(lease_api.read_namespaced_lease, FULLNAME, NAMESPACE)
        return str(lease.spec.holder_identity or "")

    seen: list[object] = []

    async def only_the_leader() -> bool:
        leader = await holder()
        listed = await endpoint_pods(cluster, FULLNAME)
        seen[:] = [leader, listed]
        return bool(leader) and listed == [leader]

    # The message names the holder and what the EndpointSlices listed last.
    try:
        await wait_until(only_the_leader, 30, "the gRPC Service never listed the leader alone")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: Lease holder and listed {seen}") from exc
    leader = await holder()
    (standby,) = set(replicas) - {leader}
    replicas[leader].process.kill()  # SIGKILL: the slice lists it until the new leader writes
    await replicas[leader].process.wait()
    killed = time.monotonic()

    async def moved() -> bool:
        return await endpoint_pods(cluster, FULLNAME) == [standby]

    await wait_until(moved, LEASE_SECONDS + 30, "the Service never moved to the new leader")
    failover = time.monotonic() - killed
    assert failover < LEASE_SECONDS + ENDPOINT_SLACK_SECONDS, failover
    print(f"EndpointSlice failover: {failover:.1f}s")
    await leadership_event_shown(cluster, standby)


async def leadership_event_shown(cluster: Cluster, pod_name: str) -> None:
    """The new leader's LeadershipGained Event, written with the chart's RBAC, where `kubectl
    describe pod` looks: the Pod's namespace, selected by its uid."""
    core = cluster.core()
    pod = await asyncio.to_thread(core.read_namespaced_pod, pod_name, NAMESPACE)
    selector = f"involvedObject.uid={pod.metadata.uid},reason=LeadershipGained"

    async def shown() -> bool:
        found = await asyncio.to_thread(
            core.list_namespaced_event, NAMESPACE, field_selector=selector
        )
        return len(found.items) == 1

    await wait_until(shown, 30, f"no LeadershipGained Event on Pod {pod_name}")


async def test_the_kustomize_base_rolls_out_two_replicas(cluster: Cluster) -> None:
    built = await asyncio.to_thread(_run, [ensure(KUSTOMIZE), "build", str(KUSTOMIZE_BASE)])
    assert built.returncode == 0, built.stderr
    with cluster.kube.client() as api:
        for doc in yaml.safe_load_all(built.stdout):
            if doc:
                _create(api, doc)
    await wait_rollout(cluster, "kube-system", "cloudscale-autoscaler", 60)
    discovery = k8s.DiscoveryV1Api(cluster.kube.client())

    async def both_scraped() -> bool:
        # The EndpointSlice controller follows the rollout a moment later.
        slices = await asyncio.to_thread(
            discovery.list_namespaced_endpoint_slice, "kube-system",
            label_selector="kubernetes.io/service-name=cloudscale-autoscaler-metrics",
        )  # fmt: skip
        return sum(len(found.endpoints or []) for found in slices.items) == 2

    await wait_until(both_scraped, 30, "the metrics Service never listed both replicas")


def _create(api: k8s.ApiClient, doc: dict[str, Any]) -> None:
    """Create any kind, cert-manager's too; the base's RBAC and leader-route objects exist
    already (fixtures/kube.py applied the same files)."""
    resource = DynamicClient(api).resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    with contextlib.suppress(ConflictError):
        resource.create(body=doc, namespace=doc["metadata"].get("namespace"))


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
