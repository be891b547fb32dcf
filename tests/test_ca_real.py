"""The real Cluster Autoscaler against our real `serve` process, on a loopback cluster
(kube-apiserver, kube-controller-manager, kube-scheduler, kwok; tests/fixtures/cluster.py).

A small stand-in plays the cloudscale cloud controller manager and the kubelet: for every
running server of the emulator a Node named like the server, `spec.providerID:
cloudscale://<uuid>`, the CCM's instance-type/zone/region labels and the flavor's capacity,
kept Ready by kwok (docs/conformance.md lists what it assumes). What is asserted is what CA
decided (its log, its status ConfigMap) and what the cloud holds.

The cluster is shared by the module; every scenario starts with no Nodes, no load and no
status or expander ConfigMap, and leaves none (`cluster`), and has its own emulator and
provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.autoscaler import GENERATIONS, ensure_autoscaler
from fixtures.cluster import KWOK_ANNOTATION, Cluster, running_cluster
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.kube import NEEDS_KUBE, running_kube
from fixtures.stack import wait_until
from fixtures.tls import PKI
from fixtures.tools import free_port
from kubernetes import client as k8s

from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP

pytestmark = [pytest.mark.ca, pytest.mark.kube, NEEDS_KUBE]

CLUSTER = "real"
NAMESPACE = "kube-system"  # CA's: its status ConfigMap and the priority expander's live here
STATUS = "cluster-autoscaler-status"
PRIORITIES = "cluster-autoscaler-priority-expander"
# flex-4-2 / flex-8-2 / plus-8-2: 2 vCPUs, so one of these pods per node: CA's estimator asks
# for one node each.
POD_CPU = "1500m"
PODS = 3
UNNEEDED_SECONDS = 5
VERSIONS = list(GENERATIONS)
# CI time: the scenarios whose wire does not change across generations run on the two newest
# (the slow refusal is our provider's path; the price expander's calls are the same since 1.34.2).
NEWEST = VERSIONS[-2:]
# The plain `pytest` run (CI) leaves out the scenarios marked ca_extended (pyproject's addopts:
# each takes one to two minutes); `pytest -m ca` runs them all.
EXTENDED = pytest.mark.ca_extended


def group(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "minSize": 0, "maxSize": 5, "flavor": "flex-4-2",
            "image": "debian-12", "zone": "lpg1", **fields}  # fmt: skip


@pytest.fixture(scope="module")
def loopback_cluster() -> Iterator[Cluster]:
    with (
        tempfile.TemporaryDirectory(prefix="ca-cluster-") as directory,
        running_kube(Path(directory)) as kube,
        running_cluster(kube, Path(directory), nodes=0) as running,
    ):
        yield running


@pytest.fixture
async def cluster(loopback_cluster: Cluster) -> AsyncIterator[Cluster]:
    """The module's cluster, emptied again after the test however it ended."""
    yield loopback_cluster
    await clean(loopback_cluster)


def node_for(server: dict[str, Any]) -> dict[str, Any]:
    """What the CCM and the kubelet register for a booted server (kubelet defaults: no
    reservations, evictionHard memory.available 100Mi, 110 pods). Not Ready yet, as a kubelet
    registers: with no Ready condition at all, the node lifecycle controller would lift the
    not-ready taint at once and the scheduler bind pods before kwok takes the Node over."""
    zone = server["zone"]["slug"]
    flavor = server["flavor"]
    memory_mi = flavor["memory_gb"] * 1024
    return {
        "metadata": {
            "name": server["name"],
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": server["name"],
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": flavor["slug"],
                "topology.kubernetes.io/zone": zone,
                "topology.kubernetes.io/region": zone.rstrip("0123456789"),
            },
        },
        "spec": {"providerID": f"cloudscale://{server['uuid']}"},
        "status": {
            "capacity": {"cpu": str(flavor["vcpu_count"]), "memory": f"{memory_mi}Mi",
                         "pods": "110"},
            "allocatable": {"cpu": str(flavor["vcpu_count"]), "memory": f"{memory_mi - 100}Mi",
                            "pods": "110"},
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                            "message": "container runtime status check may not have completed"}],
        },
    }  # fmt: skip


async def kubelets(cluster: Cluster, emulator: RunningEmulator) -> None:
    """Nodes follow the emulator's running servers, until cancelled."""
    api = cluster.core()
    while True:
        servers = {s["name"]: s for s in await emulator.admin.servers() if s["status"] == "running"}
        nodes = await asyncio.to_thread(api.list_node)
        present = {node.metadata.name for node in nodes.items}
        for name in servers.keys() - present:
            await asyncio.to_thread(api.create_node, node_for(servers[name]))
        for name in present - servers.keys():
            with contextlib.suppress(k8s.ApiException):
                await asyncio.to_thread(api.delete_node, name)
        await asyncio.sleep(0.5)


class Autoscaler:
    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"CA exited {self.process.returncode}:\n{self.output[-4000:]}")


def start_autoscaler(
    version: str,
    cluster: Cluster,
    provider: ServeProcess,
    pki: PKI,
    directory: Path,
    flags: tuple[str, ...],
) -> Autoscaler:
    cloud_config = directory / "cloud-config.yaml"
    cloud_config.write_text(yaml.safe_dump({
        "address": f"localhost:{provider.port}", "cert": str(pki.client_cert),
        "key": str(pki.client_key), "cacert": str(pki.ca_cert), "grpc_timeout": "10s",
    }))  # fmt: skip
    log = directory / f"cluster-autoscaler-{version}.log"
    argv = [
        str(ensure_autoscaler(version)), "--cloud-provider=externalgrpc",
        f"--cloud-config={cloud_config}", f"--kubeconfig={cluster.kube.admin_kubeconfig}",
        f"--namespace={NAMESPACE}", "--leader-elect=false", "--scan-interval=2s",
        "--scale-down-delay-after-add=0s", "--scale-down-delay-after-delete=0s",
        "--node-delete-delay-after-taint=0s",
        "--max-node-provision-time=2m", f"--address=127.0.0.1:{free_port()}", "--v=2",
        "--logtostderr", *flags,
    ]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return Autoscaler(process, log)


async def clean(cluster: Cluster) -> None:
    """Back to an empty cluster: no load, no Nodes, none of CA's ConfigMaps."""
    core, apps = cluster.core(), k8s.AppsV1Api(cluster.kube.client())
    with contextlib.suppress(k8s.ApiException):
        await asyncio.to_thread(apps.delete_namespaced_deployment, "load", "default")
    for name in (STATUS, PRIORITIES):
        with contextlib.suppress(k8s.ApiException):
            await asyncio.to_thread(core.delete_namespaced_config_map, name, NAMESPACE)

    async def empty() -> bool:
        # Deleted again at every look: until the garbage collector has removed the
        # Deployment's ReplicaSet, it replaces the Pods deleted before. Forced: the Pods'
        # Nodes go too, and nothing would finish a graceful deletion then.
        await asyncio.to_thread(core.delete_collection_namespaced_pod, "default",
                                label_selector="app=load", grace_period_seconds=0)  # fmt: skip
        await asyncio.to_thread(core.delete_collection_node)
        pods = await asyncio.to_thread(
            core.list_namespaced_pod, "default", label_selector="app=load"
        )
        nodes = await asyncio.to_thread(core.list_node)
        return not pods.items and not nodes.items

    await wait_until(empty, 60, "the load's Pods and the Nodes never went")


@contextlib.asynccontextmanager
async def scene(
    version: str,
    groups: list[dict[str, Any]],
    cluster: Cluster,
    pki: PKI,
    emulator: RunningEmulator,
    directory: Path,
    *,
    flags: tuple[str, ...] = (),
    **provider_config: Any,
) -> AsyncIterator[Autoscaler]:
    """Our provider serving `groups`, the CCM/kubelet stand-in, and CA `version` with `flags`
    on top of the common ones."""
    config = write_config(directory / "provider", pki, emulator.url, TOKEN, cluster=CLUSTER,
                          groups=groups, **provider_config)  # fmt: skip
    provider = await start_serve(config, log_level="info")
    stand_in = asyncio.create_task(kubelets(cluster, emulator))
    ca = start_autoscaler(version, cluster, provider, pki, directory, flags)
    try:
        yield ca
    finally:
        ca.process.terminate()
        ca.process.wait(30)
        stand_in.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stand_in
        await provider.kill()


async def servers_of(emulator: RunningEmulator, name: str) -> list[dict[str, Any]]:
    return [
        s for s in await emulator.admin.servers()
        if s["tags"].get(TAG_CLUSTER) == CLUSTER and s["tags"].get(TAG_GROUP) == name
    ]  # fmt: skip


def pending_pods(count: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "load"},
        "spec": {
            "replicas": count,
            "selector": {"matchLabels": {"app": "load"}},
            "template": {
                "metadata": {"labels": {"app": "load"}},
                "spec": {"containers": [{
                    "name": "load", "image": "load",
                    "resources": {"requests": {"cpu": POD_CPU, "memory": "100Mi"}},
                }]},
            },
        },
    }  # fmt: skip


async def load(cluster: Cluster, replicas: int) -> None:
    apps = k8s.AppsV1Api(cluster.kube.client())
    await asyncio.to_thread(apps.create_namespaced_deployment, "default", pending_pods(replicas))


async def load_pods(cluster: Cluster) -> list[k8s.V1Pod]:
    pods = await asyncio.to_thread(
        cluster.core().list_namespaced_pod, "default", label_selector="app=load"
    )
    return list(pods.items)


async def wait_all_running(cluster: Cluster, ca: Autoscaler, count: int, what: str) -> None:
    async def all_running() -> bool:
        ca.alive()
        pods = await load_pods(cluster)
        return len(pods) == count and all(p.status.phase == "Running" for p in pods)

    await wait_until(all_running, 120, what)


async def node_groups_status(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """CA's status ConfigMap (YAML since CA 1.30), per node group."""
    status = await asyncio.to_thread(cluster.core().read_namespaced_config_map, STATUS, NAMESPACE)
    document = yaml.safe_load(status.data["status"])
    return {entry["name"]: entry for entry in document.get("nodeGroups") or []}


@pytest.mark.parametrize("version", VERSIONS)
async def test_scale_from_zero_then_down_as_ca_decides(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """No autoscalingOptions: on CA 1.35+ they would make the NotReady new nodes unready at
    once (MaxNodeStartupTime 0, upstream #10245) and CA scale up again (README, Troubleshooting)."""
    await load(cluster, PODS)
    async with scene(version, [group("workers")], cluster, pki, emulator, tmp_path,
                     flags=(f"--scale-down-unneeded-time={UNNEEDED_SECONDS}s",)) as ca:  # fmt: skip
        await wait_all_running(cluster, ca, PODS, "the pending pods never ran on new nodes")
        assert len(await servers_of(emulator, "workers")) == PODS, "one node per pod, as asked"
        assert "workers 0->3 (max: 5)" in ca.output, ca.output[-4000:]
        assert "workers" in await node_groups_status(cluster)

        # Two pods go: their nodes are idle, CA deletes them after the unneeded time.
        apps = k8s.AppsV1Api(cluster.kube.client())
        await asyncio.to_thread(
            apps.patch_namespaced_deployment, "load", "default", {"spec": {"replicas": 1}}
        )
        idle_since = asyncio.get_running_loop().time()

        async def one_left() -> bool:
            ca.alive()
            return len(await servers_of(emulator, "workers")) == 1

        await wait_until(one_left, 120, "CA never scaled the idle nodes down")
        waited = asyncio.get_running_loop().time() - idle_since
        assert waited >= UNNEEDED_SECONDS, "deleted before they were unneeded long enough"
        assert "Scale-down: removing empty node" in ca.output or "removing node" in ca.output


def priorities(first: str, then: str) -> dict[str, Any]:
    """The priority expander's ConfigMap: `first` whenever it can help, else `then`."""
    return {
        "metadata": {"name": PRIORITIES},
        "data": {"priorities": yaml.safe_dump({20: [f"^{first}$"], 10: [f"^{then}$"]})},
    }


# How the API refuses: at once, or only after IncreaseSize has answered (the create call is
# slower than the provider's wait), so the refusal reaches CA through NodeGroupNodes alone.
REFUSALS = {
    "instant": {},
    "slow": {"latency": {"create_server": {"fixed_ms": 1500}}},
}


@pytest.mark.parametrize(
    ("version", "refusal"),
    [
        pytest.param(version, "instant", marks=() if version in NEWEST else EXTENDED)
        for version in VERSIONS
    ]
    + [pytest.param(version, "slow", marks=EXTENDED) for version in NEWEST],
)
async def test_out_of_capacity_zone_backs_off_and_the_other_group_takes_over(
    version: str,
    refusal: str,
    cluster: Cluster,
    pki: PKI,
    emulator: RunningEmulator,
    tmp_path: Path,
) -> None:
    """lpg1 has no capacity: CA tries the group it prefers there, sees our OutOfResources
    placeholders, backs that group off and scales the group in rma1 instead."""
    full, spare = group("lpg-workers", zone="lpg1"), group("rma-workers", zone="rma1")
    await emulator.admin.set_faults({"zones_out_of_capacity": ["lpg1"], **REFUSALS[refusal]})
    await asyncio.to_thread(cluster.core().create_namespaced_config_map, NAMESPACE,
                            priorities(full["name"], spare["name"]))  # fmt: skip
    await load(cluster, PODS)
    async with scene(version, [full, spare], cluster, pki, emulator, tmp_path,
                     flags=("--expander=priority",)) as ca:  # fmt: skip
        await wait_all_running(cluster, ca, PODS, "the pods never ran on the other group's nodes")
        output = ca.output
        assert "lpg-workers 0->3 (max: 5)" in output, "CA never tried the preferred group first"
        assert "Disabling scale-up for node group lpg-workers" in output, output[-4000:]
        assert "errorClass=OutOfResource; errorCode=ZONE_CAPACITY_EXHAUSTED" in output
        assert "rma-workers 0->3 (max: 5)" in output

        async def backed_off_and_rolled_back() -> bool:
            # CA deleted the placeholders (DeleteNodes), so the group's target is 0 again.
            entry = (await node_groups_status(cluster))["lpg-workers"]
            scale_up = entry["scaleUp"]
            return (
                scale_up["status"] == "Backoff"
                and scale_up.get("backoffInfo", {}).get("errorCode") == "ZONE_CAPACITY_EXHAUSTED"
                and entry["health"]["cloudProviderTarget"] == 0
            )

        await wait_until(backed_off_and_rolled_back, 30, "lpg-workers never showed as backed off")

        rma = {s["name"] for s in await servers_of(emulator, spare["name"])}
        assert {pod.spec.node_name for pod in await load_pods(cluster)} <= rma
        assert len(rma) == PODS
        assert await servers_of(emulator, full["name"]) == [], "nothing of lpg-workers is left"


@pytest.mark.parametrize("version", NEWEST)
async def test_price_expander_picks_the_cheaper_group(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """Two groups of the same shape (8 GB, 2 vCPUs), one ten times the price: CA's price
    expander, which asks our PricingNodePrice and PricingPodPrice, scales the cheap one. The
    priority expander after it prefers the dear one, so only our prices can make that choice."""
    cheap, dear = group("flex-workers", flavor="flex-8-2"), group("plus-workers", flavor="plus-8-2")
    pricing = {"currency": "CHF", "flavorsPerHour": {"flex-8-2": "0.05", "plus-8-2": "0.5"},
               "volumePerGBHour": "0"}  # fmt: skip
    await asyncio.to_thread(cluster.core().create_namespaced_config_map, NAMESPACE,
                            priorities(dear["name"], cheap["name"]))  # fmt: skip
    await load(cluster, PODS)
    async with scene(version, [cheap, dear], cluster, pki, emulator, tmp_path,
                     flags=("--expander=price,priority",), pricing=pricing) as ca:  # fmt: skip
        await wait_all_running(cluster, ca, PODS, "the pending pods never ran on new nodes")
        assert "flex-workers 0->3 (max: 5)" in ca.output, ca.output[-4000:]
        flex = {s["name"] for s in await servers_of(emulator, cheap["name"])}
        assert {pod.spec.node_name for pod in await load_pods(cluster)} <= flex
        assert len(flex) == PODS
        assert await servers_of(emulator, dear["name"]) == []
