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
import re
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.autoscaler import GENERATIONS, Autoscaler, run_autoscaler
from fixtures.cluster import KWOK_ANNOTATION, Cluster, running_cluster
from fixtures.emulator import AUTH_HEADERS, TOKEN, RunningEmulator
from fixtures.kube import NEEDS_KUBE, reset_election, running_kube
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


# What a real node's user data hands its kubelet; the stand-in reads the flags back.
KUBELET_USER_DATA = """#cloud-config
runcmd:
  - kubelet --node-labels=${node_labels} --register-with-taints=${node_taints}
"""
GPU_LABEL = "cloudscale.ch/gpu"  # the provider's default gpuLabel
NVIDIA_GPU = "nvidia.com/gpu"
# How long after its Node registers a GPU server's device plugin reports the GPUs: CA must
# count such a Node as still starting (it carries the GPU label), not scale up again.
DEVICE_PLUGIN_SECONDS = 10.0


MAX_SIZE = 5


def group(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "minSize": 0, "maxSize": MAX_SIZE, "flavor": "flex-4-2",
            "image": "debian-12", "zone": "lpg1", "userData": KUBELET_USER_DATA,
            **fields}  # fmt: skip


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


def kubelet_flag(user_data: str | None, flag: str) -> list[str]:
    """The comma-separated values of `--<flag>=` in a server's user data."""
    found = re.search(rf"--{flag}=(\S*)", user_data or "")
    return [item for item in (found.group(1) if found else "").split(",") if item]


def taint(text: str) -> dict[str, str]:
    """`key=value:Effect` or `key:Effect`, as `--register-with-taints` takes it."""
    head, effect = text.rsplit(":", 1)
    key, _, value = head.partition("=")
    return (
        {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}
    )


def node_for(server: dict[str, Any], user_data: str | None) -> dict[str, Any]:
    """What the CCM and the kubelet register for a booted server (kubelet defaults: no
    reservations, evictionHard memory.available 100Mi, 110 pods; the labels and taints its
    user data passes with --node-labels and --register-with-taints). Not Ready yet, as a kubelet
    registers: with no Ready condition at all, the node lifecycle controller would lift the
    not-ready taint at once and the scheduler bind pods before kwok takes the Node over. No
    GPUs yet either: the device plugin reports them later (`gpus_reported`)."""
    zone = server["zone"]["slug"]
    flavor = server["flavor"]
    memory_mi = flavor["memory_gb"] * 1024
    labels = dict(item.split("=", 1) for item in kubelet_flag(user_data, "node-labels"))
    return {
        "metadata": {
            "name": server["name"],
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {
                **labels,
                "kubernetes.io/hostname": server["name"],
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": flavor["slug"],
                "topology.kubernetes.io/zone": zone,
                "topology.kubernetes.io/region": zone.rstrip("0123456789"),
            },
        },
        "spec": {
            "providerID": f"cloudscale://{server['uuid']}",
            "taints": [taint(t) for t in kubelet_flag(user_data, "register-with-taints")],
        },
        "status": {
            "capacity": {"cpu": str(flavor["vcpu_count"]), "memory": f"{memory_mi}Mi",
                         "pods": "110"},
            "allocatable": {"cpu": str(flavor["vcpu_count"]), "memory": f"{memory_mi - 100}Mi",
                            "pods": "110"},
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                            "message": "container runtime status check may not have completed"}],
        },
    }  # fmt: skip


def gpus_reported(node: k8s.V1Node, gpus: int) -> dict[str, Any]:
    """The status patch of the NVIDIA device plugin registering `gpus` GPUs."""
    count = str(gpus)
    return {"status": {"capacity": {**node.status.capacity, NVIDIA_GPU: count},
                       "allocatable": {**node.status.allocatable, NVIDIA_GPU: count}}}  # fmt: skip


async def gpu_counts(emulator: RunningEmulator) -> dict[str, int]:
    """Each flavor's GPU count, as the API's flavor list gives it."""
    async with httpx.AsyncClient(base_url=emulator.url, headers=AUTH_HEADERS) as api:
        flavors = (await api.get("/flavors")).raise_for_status().json()
    return {f["slug"]: f["gpu"]["count"] for f in flavors if f.get("gpu")}


async def kubelets(cluster: Cluster, emulator: RunningEmulator) -> None:
    """Nodes follow the emulator's running servers, until cancelled; a GPU server's GPUs
    appear DEVICE_PLUGIN_SECONDS after its Node. Only kwok's Nodes: a real Node of the
    cluster (fixtures/node.py) is its kubelet's."""
    api = cluster.core()
    gpus = await gpu_counts(emulator)
    loop = asyncio.get_running_loop()
    registered: dict[str, float] = {}
    while True:
        servers = {s["name"]: s for s in await emulator.admin.servers() if s["status"] == "running"}
        nodes = {
            n.metadata.name: n
            for n in (await asyncio.to_thread(api.list_node)).items
            if KWOK_ANNOTATION in (n.metadata.annotations or {})
        }
        if servers.keys() - nodes.keys():
            user_data = await emulator.admin.user_data()
        for name in servers.keys() - nodes.keys():
            server = servers[name]
            await asyncio.to_thread(api.create_node, node_for(server, user_data[server["uuid"]]))
            registered[name] = loop.time()
        for name in nodes.keys() - servers.keys():
            with contextlib.suppress(k8s.ApiException):
                await asyncio.to_thread(api.delete_node, name)
        for name, node in nodes.items():
            count = gpus.get(node.metadata.labels.get("node.kubernetes.io/instance-type", ""))
            late = loop.time() - registered.get(name, loop.time()) >= DEVICE_PLUGIN_SECONDS
            if count and late and NVIDIA_GPU not in (node.status.capacity or {}):
                await asyncio.to_thread(api.patch_node_status, name, gpus_reported(node, count))
        await asyncio.sleep(0.5)


# What every scenario runs CA with: quick loops and no waits between scale-downs.
CA_FLAGS = (
    f"--namespace={NAMESPACE}", "--leader-elect=false", "--scan-interval=2s",
    "--scale-down-delay-after-add=0s", "--scale-down-delay-after-delete=0s",
    "--node-delete-delay-after-taint=0s", "--max-node-provision-time=2m", "--v=2",
    "--logtostderr",
)  # fmt: skip


def start_autoscaler(
    version: str,
    cluster: Cluster,
    port: int,
    pki: PKI,
    directory: Path,
    flags: tuple[str, ...] = (),
) -> Autoscaler:
    """CA `version` calling the provider at localhost:`port`."""
    cloud_config = directory / "cloud-config.yaml"
    cloud_config.write_text(yaml.safe_dump({
        "address": f"localhost:{port}", "cert": str(pki.client_cert),
        "key": str(pki.client_key), "cacert": str(pki.ca_cert), "grpc_timeout": "10s",
    }))  # fmt: skip
    log = directory / f"cluster-autoscaler-{version}.log"
    kubeconfig = cluster.kube.admin_kubeconfig
    own = (f"--address=127.0.0.1:{free_port()}", *CA_FLAGS, *flags)
    return run_autoscaler(version, kubeconfig, cloud_config, log, own)


async def clean(cluster: Cluster) -> None:
    """Back to an empty cluster: no load, no Nodes, none of CA's ConfigMaps."""
    core, apps = cluster.core(), k8s.AppsV1Api(cluster.kube.client())
    with contextlib.suppress(k8s.ApiException):
        await asyncio.to_thread(apps.delete_namespaced_deployment, "load", "default")
    # The ReplicaSet too, at once: left to the garbage collector, it went up to a minute later
    # and kept replacing the Pods deleted below until then.
    await asyncio.to_thread(apps.delete_collection_namespaced_replica_set, "default",
                            label_selector="app=load")  # fmt: skip
    for name in (STATUS, PRIORITIES):
        with contextlib.suppress(k8s.ApiException):
            await asyncio.to_thread(core.delete_namespaced_config_map, name, NAMESPACE)

    async def empty() -> bool:
        # Deleted again at every look, in case the ReplicaSet replaced some before it went.
        # Forced: the Pods' Nodes go too, and nothing would finish a graceful deletion then.
        await asyncio.to_thread(core.delete_collection_namespaced_pod, "default",
                                label_selector="app=load", grace_period_seconds=0)  # fmt: skip
        await asyncio.to_thread(core.delete_collection_node)
        pods = await asyncio.to_thread(
            core.list_namespaced_pod, "default", label_selector="app=load"
        )
        nodes = await asyncio.to_thread(core.list_node)
        return not pods.items and not nodes.items

    await wait_until(empty, 60, "the load's Pods and the Nodes never went")


@dataclass
class Scene:
    """A scenario's running parts: CA, and our provider (replaced when a test restarts it)."""

    ca: Autoscaler
    provider: ServeProcess
    config: Path


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
) -> AsyncIterator[Scene]:
    """Our provider serving `groups`, the CCM/kubelet stand-in, and CA `version` with `flags`
    on top of the common ones."""
    config = write_config(directory / "provider", pki, emulator.url, TOKEN, cluster=CLUSTER,
                          groups=groups, **provider_config)  # fmt: skip
    provider = await start_serve(config, log_level="info")
    stand_in = asyncio.create_task(kubelets(cluster, emulator))
    ca = start_autoscaler(version, cluster, provider.port, pki, directory, flags)
    running = Scene(ca, provider, config)
    try:
        yield running
    finally:
        ca.process.terminate()
        ca.process.wait(30)
        stand_in.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stand_in
        await running.provider.kill()


async def servers_of(emulator: RunningEmulator, name: str) -> list[dict[str, Any]]:
    return [
        s for s in await emulator.admin.servers()
        if s["tags"].get(TAG_CLUSTER) == CLUSTER and s["tags"].get(TAG_GROUP) == name
    ]  # fmt: skip


def pending_pods(count: int, gpus: int = 0, **placement: Any) -> dict[str, Any]:
    """The load: `count` Pods CA must find nodes for; `placement` adds to their spec
    (nodeSelector, tolerations)."""
    resources: dict[str, Any] = {"requests": {"cpu": POD_CPU, "memory": "100Mi"}}
    if gpus:
        # An extended resource is asked for by its limit (the request follows it).
        resources["limits"] = {NVIDIA_GPU: str(gpus)}
    return {
        "metadata": {"name": "load"},
        "spec": {
            "replicas": count,
            "selector": {"matchLabels": {"app": "load"}},
            "template": {
                "metadata": {"labels": {"app": "load"}},
                "spec": {"containers": [{"name": "load", "image": "load",
                                         "resources": resources}], **placement},
            },
        },
    }  # fmt: skip


async def load(cluster: Cluster, replicas: int, gpus: int = 0, **placement: Any) -> None:
    apps = k8s.AppsV1Api(cluster.kube.client())
    deployment = pending_pods(replicas, gpus, **placement)
    await asyncio.to_thread(apps.create_namespaced_deployment, "default", deployment)


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

    try:
        await wait_until(all_running, 120, what)
    except AssertionError as timeout:
        complaints = ca.complaints()
        raise AssertionError(f"{timeout}; CA's last warnings and errors:\n{complaints}") from None


async def scale_up_events(cluster: Cluster) -> set[str]:
    """The Events CA records once a provider has answered its IncreaseSize ("Scale-up: group
    <name> size set to ..."), by uid: the ones of earlier scenarios stay in the namespace."""
    events = await asyncio.to_thread(cluster.core().list_namespaced_event, NAMESPACE)
    return {
        e.metadata.uid for e in events.items
        if e.reason == "ScaledUpGroup" and " size set to " in (e.message or "")
    }  # fmt: skip


async def wait_answered_and_creating(
    cluster: Cluster, ca: Autoscaler, emulator: RunningEmulator, earlier: set[str]
) -> None:
    """Until CA has our answer to its IncreaseSize (an Event not in `earlier`) and the API is
    still creating. IncreaseSize sends its creates before it answers (`increaseSizeWait`): a
    provider killed in between failed that IncreaseSize for CA, which backs the group off for
    5 minutes whatever the cloud holds. The window the crash scenarios aim at is after it."""

    async def answered_and_creating() -> bool:
        ca.alive()
        if not await scale_up_events(cluster) - earlier:
            return False
        return (await emulator.admin.in_flight()).get("create_server", 0) > 0

    await wait_until(answered_and_creating, 60, "CA never had our answer while the API created")


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
    unneeded = f"--scale-down-unneeded-time={UNNEEDED_SECONDS}s"
    async with scene(version, [group("workers")], cluster, pki, emulator, tmp_path,
                     flags=(unneeded,)) as running:  # fmt: skip
        ca = running.ca
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


@pytest.mark.parametrize("version", VERSIONS)
async def test_idle_nodes_go_after_the_groups_own_unneeded_time(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """Two idle nodes of a group whose `autoscalingOptions` set scaleDownUnneededTime to 5 s,
    with CA's own flag at 10 minutes: CA deletes them within the scenario only if it read the
    group's value from NodeGroupGetOptions (1.34 reads the old duration fields, 1.35+ the new
    ones). The nodes exist and are Ready before CA starts: no scale-up, so #10245's zero
    MaxNodeStartupTime on 1.35+ plays no part."""
    tags = {TAG_CLUSTER: CLUSTER, TAG_GROUP: "workers"}
    await emulator.admin.populate(2, tags, zone="lpg1", name_prefix="idle")
    options = {"scaleDownUnneededTime": f"{UNNEEDED_SECONDS}s"}
    workers = group("workers", autoscalingOptions=options)
    async with scene(version, [workers], cluster, pki, emulator, tmp_path,
                     flags=("--scale-down-unneeded-time=10m",)) as running:  # fmt: skip
        ca = running.ca
        started = asyncio.get_running_loop().time()

        async def gone() -> bool:
            ca.alive()
            return await servers_of(emulator, "workers") == []

        await wait_until(gone, 120, "CA never removed the idle nodes by the group's unneeded time")
        waited = asyncio.get_running_loop().time() - started
        assert waited >= UNNEEDED_SECONDS, "deleted before they were unneeded long enough"
        assert "Scale-down: removing empty node" in ca.output, ca.output[-4000:]
        assert {d["by"] for d in await emulator.admin.deletions()} == {"api"}


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


@dataclass(frozen=True)
class Shortage:
    """A resource the preferred group cannot get, and a spare group that still gets it."""

    faults: dict[str, Any]
    preferred: dict[str, Any]
    spare: dict[str, Any]
    pods: int
    code: str


SHORTAGES = {
    # lpg1 has no capacity left; rma1 has.
    "capacity": Shortage(
        {"zones_out_of_capacity": ["lpg1"]},
        group("lpg-workers", zone="lpg1"),
        group("rma-workers", zone="rma1"),
        PODS,
        "ZONE_CAPACITY_EXHAUSTED",
    ),
    # The account's quota leaves 3 vCPUs: a 4-vCPU server is refused, a 2-vCPU one is not.
    "quota": Shortage(
        {"quota": {"max_vcpus": 3}},
        group("big-workers", flavor="flex-8-4"),
        group("small-workers", flavor="flex-4-2"),
        1,
        "QUOTA_EXCEEDED",
    ),
}


def shortage_cases() -> list[tuple[str, str, str]]:
    """Capacity refused at once on every generation; the rest on the two newest."""
    cases = [(v, "capacity", "instant") for v in VERSIONS]
    cases += [(v, "capacity", "slow") for v in NEWEST]
    return cases + [(v, "quota", refusal) for v in NEWEST for refusal in REFUSALS]


@pytest.mark.parametrize(("version", "shortage", "refusal"), shortage_cases())
async def test_a_refused_group_backs_off_and_the_other_group_takes_over(
    version: str,
    shortage: str,
    refusal: str,
    cluster: Cluster,
    pki: PKI,
    emulator: RunningEmulator,
    tmp_path: Path,
) -> None:
    """The API refuses the group CA prefers (a zone out of capacity, a full quota): CA sees our
    OutOfResources placeholders, backs that group off and scales the spare group instead."""
    case = SHORTAGES[shortage]
    full, spare = case.preferred["name"], case.spare["name"]
    await emulator.admin.set_faults({**case.faults, **REFUSALS[refusal]})
    await asyncio.to_thread(cluster.core().create_namespaced_config_map, NAMESPACE,
                            priorities(full, spare))  # fmt: skip
    await load(cluster, case.pods)
    async with scene(version, [case.preferred, case.spare], cluster, pki, emulator, tmp_path,
                     flags=("--expander=priority",)) as running:  # fmt: skip
        ca = running.ca
        await wait_all_running(cluster, ca, case.pods, "the pods never ran on the spare group")
        output = ca.output
        assert f"{full} 0->{case.pods} (max: 5)" in output, "CA never tried its preferred group"
        assert f"Disabling scale-up for node group {full}" in output, output[-4000:]
        assert f"errorClass=OutOfResource; errorCode={case.code}" in output
        assert f"{spare} 0->{case.pods} (max: 5)" in output

        async def backed_off_and_rolled_back() -> bool:
            # CA deleted the placeholders (DeleteNodes), so the group's target is 0 again.
            entry = (await node_groups_status(cluster))[full]
            scale_up = entry["scaleUp"]
            return (
                scale_up["status"] == "Backoff"
                and scale_up.get("backoffInfo", {}).get("errorCode") == case.code
                and entry["health"]["cloudProviderTarget"] == 0
            )

        await wait_until(backed_off_and_rolled_back, 30, f"{full} never showed as backed off")

        nodes = {s["name"] for s in await servers_of(emulator, spare)}
        assert {pod.spec.node_name for pod in await load_pods(cluster)} <= nodes
        assert len(nodes) == case.pods
        assert await servers_of(emulator, full) == [], f"nothing of {full} is left"


@pytest.mark.parametrize("version", NEWEST)
async def test_a_gpu_group_scales_from_zero_for_a_gpu_pod_once(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """A pod asking for a GPU: CA picks the GPU group (its template has the flavor's GPU) and
    makes one server. The Node comes up without GPUs until the device plugin reports them; it
    carries our GPU label (from the user data), so CA counts it as still starting and does not
    scale up a second time."""
    gpu = group("gpu-workers", flavor="gpu2-128-16-1-200", zone="rma1", maxSize=3)
    await load(cluster, 1, gpus=1)
    async with scene(version, [group("workers"), gpu], cluster, pki, emulator,
                     tmp_path) as running:  # fmt: skip
        ca = running.ca
        await wait_all_running(cluster, ca, 1, "the GPU pod never ran")
        servers = await servers_of(emulator, "gpu-workers")
        assert len(servers) == 1, "CA scaled up again for a GPU node not yet reporting its GPU"
        [server] = servers
        assert await servers_of(emulator, "workers") == []
        assert "gpu-workers 0->1 (max: 3)" in ca.output, ca.output[-4000:]
        node = await asyncio.to_thread(cluster.core().read_node, server["name"])
        assert node.metadata.labels.get(GPU_LABEL), "the GPU label never reached the kubelet"
        # A few more loops with the GPU in use: still one server.
        await asyncio.sleep(6)
        ca.alive()
        assert len(await servers_of(emulator, "gpu-workers")) == 1, ca.output[-4000:]
        assert "gpu-workers 1->2" not in ca.output


@pytest.mark.parametrize("version", NEWEST)
async def test_a_provider_crash_during_a_scale_up_loses_and_doubles_nothing(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """Our provider is killed while its creates are on their way (the API answers each after
    3 s) and started again at once, while the API is still creating: the new process counts
    the creates its journal (stateDir) holds, CA's plan is carried out once, with no server
    lost, orphaned or made twice, and never more than maxSize."""
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 3000}}})
    await load(cluster, PODS)
    earlier = await scale_up_events(cluster)
    async with scene(version, [group("workers")], cluster, pki, emulator, tmp_path,
                     stateDir=str(tmp_path / "state")) as running:  # fmt: skip
        ca = running.ca
        await wait_answered_and_creating(cluster, ca, emulator, earlier)
        await running.provider.kill()
        running.provider = await start_serve(running.config, log_level="info")
        assert (await emulator.admin.in_flight()).get("create_server", 0) > 0, "restarted late"
        await wait_all_running(cluster, ca, PODS, "the pods never ran after the restart")
        servers = await emulator.admin.servers()
        assert len(servers) == PODS <= MAX_SIZE, [s["name"] for s in servers]
        assert all(s["tags"].get(TAG_GROUP) == "workers" for s in servers)
        assert ca.output.count("workers 0->3 (max: 5)") == 1, ca.output[-4000:]
        assert "sent by an earlier process and not listed yet" in running.provider.output


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
                     flags=("--expander=price,priority",), pricing=pricing) as running:  # fmt: skip
        ca = running.ca
        await wait_all_running(cluster, ca, PODS, "the pending pods never ran on new nodes")
        assert "flex-workers 0->3 (max: 5)" in ca.output, ca.output[-4000:]
        flex = {s["name"] for s in await servers_of(emulator, cheap["name"])}
        assert {pod.spec.node_name for pod in await load_pods(cluster)} <= flex
        assert len(flex) == PODS
        assert await servers_of(emulator, dear["name"]) == []


# Leader election as the chart's defaults scaled down, so a failover fits a scenario.
LEASE = "cloudscale-autoscaler"  # the one Lease name deploy/'s Role lets the provider update
ELECTION = {"enabled": True, "leaseName": LEASE, "namespace": NAMESPACE,
            "leaseDuration": "3s", "renewDeadline": "2s", "retryPeriod": "500ms"}  # fmt: skip


async def lease_holder(cluster: Cluster) -> str | None:
    api = k8s.CoordinationV1Api(cluster.kube.client())
    try:
        lease = await asyncio.to_thread(api.read_namespaced_lease, LEASE, NAMESPACE)
    except k8s.ApiException:
        return None
    return str(lease.spec.holder_identity or "") or None


def identity(replica: ServeProcess) -> str:
    """A replica's Lease identity outside a pod (kube/lease.py): host name and process id."""
    return f"{socket.gethostname()}_{replica.process.pid}"


@contextlib.asynccontextmanager
async def leader_service(cluster: Cluster, replicas: list[ServeProcess]) -> AsyncIterator[int]:
    """What the chart's gRPC Service does for CA, on a port: each new connection goes to the
    replica holding the Lease (the holder points the Service's EndpointSlice at its Pod); a
    connection whose replica died ends, and CA connects again."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def connect(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        holder = await lease_holder(cluster)
        ports = {identity(r): r.port for r in replicas if r.process.returncode is None}
        if holder not in ports:
            client_w.close()  # no endpoint: the Service refuses, as kube-proxy does
            return
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", ports[holder])
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    server = await asyncio.start_server(connect, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@pytest.mark.parametrize("version", NEWEST)
async def test_a_failover_during_a_scale_up_loses_and_doubles_nothing(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """Two replicas with leader election; CA reaches the leader through a stand-in for the
    chart's Service. The leader is killed while its creates are on their way (the API answers
    each after 8 s, longer than the takeover): the standby takes the Lease, counts the creates
    the journal's ConfigMap holds while the API is still carrying them out, and serves CA,
    which carries out its plan once, never past maxSize."""
    await asyncio.to_thread(reset_election, cluster.kube)
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 8000}}})
    kubernetes = {"kubeconfig": str(cluster.kube.provider_kubeconfig), "driftInterval": "0s",
                  "leaderElection": ELECTION}  # fmt: skip
    replicas = []
    for name in ("replica-a", "replica-b"):
        config = write_config(tmp_path / name, pki, emulator.url, TOKEN, cluster=CLUSTER,
                              groups=[group("workers")], kubernetes=kubernetes)  # fmt: skip
        replicas.append(await start_serve(config, log_level="info"))
    stand_in = asyncio.create_task(kubelets(cluster, emulator))
    ca = None
    try:

        async def elected() -> bool:
            return await lease_holder(cluster) in {identity(r) for r in replicas}

        await wait_until(elected, 30, "no replica took the Lease")
        async with leader_service(cluster, replicas) as port:
            await load(cluster, PODS)
            earlier = await scale_up_events(cluster)
            ca = start_autoscaler(version, cluster, port, pki, tmp_path)
            await wait_answered_and_creating(cluster, ca, emulator, earlier)
            [leader] = [r for r in replicas if identity(r) == await lease_holder(cluster)]
            await leader.kill()
            [standby] = [r for r in replicas if r is not leader]

            async def taken_over() -> bool:
                return await lease_holder(cluster) == identity(standby)

            await wait_until(taken_over, 30, "the standby never took the Lease")
            assert (await emulator.admin.in_flight()).get("create_server", 0) > 0, "took over late"
            await wait_all_running(cluster, ca, PODS, "the pods never ran after the failover")
            servers = await emulator.admin.servers()
            assert len(servers) == PODS <= MAX_SIZE, [s["name"] for s in servers]
            assert all(s["tags"].get(TAG_GROUP) == "workers" for s in servers)
            assert ca.output.count("workers 0->3 (max: 5)") == 1, ca.output[-4000:]
            assert "acquired Lease" in standby.output
    finally:
        if ca is not None:
            ca.process.terminate()
            ca.process.wait(30)
        stand_in.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stand_in
        for replica in replicas:
            await replica.kill()
        await asyncio.to_thread(reset_election, cluster.kube)


# --- a pool in two zones, and managed anti-affinity (issue 32) -----------------------------

POOL_LABEL = "autoscaler.cloudscale.ch/pool"
# What docs/deployment.md tells to run CA with for a pool fanned out by `zones`: the zonal
# groups are similar by their pool label (--balancing-label works alike in 1.34 to 1.37).
BALANCING = ("--balance-similar-node-groups=true", f"--balancing-label={POOL_LABEL}")
# CA's backoff of a group whose creates failed, short enough to see the zone used again.
BACKOFF = ("--initial-node-group-backoff-duration=10s", "--max-node-group-backoff-duration=10s")


def pool(name: str, **fields: Any) -> dict[str, Any]:
    """A group fanned out into lpg1 and rma1."""
    entry = {**group(name, **fields), "zones": ["lpg1", "rma1"]}
    del entry["zone"]
    return entry


async def servers_by_zone(emulator: RunningEmulator) -> dict[str, int]:
    counts: dict[str, int] = {}
    for server in await emulator.admin.servers():
        counts[server["zone"]["slug"]] = counts.get(server["zone"]["slug"], 0) + 1
    return counts


async def scale_load(cluster: Cluster, replicas: int) -> None:
    apps = k8s.AppsV1Api(cluster.kube.client())
    await asyncio.to_thread(apps.patch_namespaced_deployment_scale, "load", "default",
                            {"spec": {"replicas": replicas}})  # fmt: skip


@pytest.mark.parametrize("version", NEWEST)
async def test_a_pool_in_two_zones_is_split_evenly(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """Four pending pods that each need a node: CA sees workers-lpg1 and workers-rma1 as
    similar (same pool label) and splits the scale-up, two servers per zone."""
    await load(cluster, 4)
    async with scene(version, [pool("workers")], cluster, pki, emulator, tmp_path,
                     flags=BALANCING) as running:  # fmt: skip
        await wait_all_running(cluster, running.ca, 4, "the pods never ran")
        assert await servers_by_zone(emulator) == {"lpg1": 2, "rma1": 2}, running.ca.complaints()
        assert "Splitting scale-up between 2 similar node groups" in running.ca.output


@pytest.mark.parametrize("version", NEWEST)
async def test_a_zone_out_of_capacity_falls_over_and_is_used_again_once_it_recovers(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """lpg1 refuses new servers: CA backs workers-lpg1 off (our OutOfResources placeholders)
    and the scale-up ends in rma1. Once lpg1 has room again and the backoff is over, the next
    scale-up goes to lpg1, the smaller zone."""
    await emulator.admin.set_faults({"zones_out_of_capacity": ["lpg1"]})
    await load(cluster, 2)
    async with scene(version, [pool("workers")], cluster, pki, emulator, tmp_path,
                     flags=BALANCING + BACKOFF) as running:  # fmt: skip
        ca = running.ca
        await wait_all_running(cluster, ca, 2, "the pods never ran in the other zone")
        assert await servers_by_zone(emulator) == {"rma1": 2}
        assert "Disabling scale-up for node group workers-lpg1" in ca.output, ca.complaints()
        await emulator.admin.clear_faults()
        await asyncio.sleep(10)  # CA's backoff of workers-lpg1 (BACKOFF) runs out
        await scale_load(cluster, 4)
        await wait_all_running(cluster, ca, 4, "the pods never ran once lpg1 recovered")
        assert await servers_by_zone(emulator) == {"lpg1": 2, "rma1": 2}, ca.complaints()


async def managed_server_groups(emulator: RunningEmulator) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=emulator.url, headers=AUTH_HEADERS) as api:
        answer = await api.get("/server-groups", params={f"tag:{TAG_CLUSTER}": CLUSTER})
        answer.raise_for_status()
        return list(answer.json())


@pytest.mark.parametrize("version", NEWEST)
async def test_an_anti_affine_group_fills_server_groups_of_four_and_leaves_none_at_zero(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """antiAffinity: six servers go into two server groups the provider made (four and two);
    scaled back to zero, none of them is left."""
    await load(cluster, 6)
    workers = group("workers", maxSize=6, antiAffinity=True)
    unneeded = (f"--scale-down-unneeded-time={UNNEEDED_SECONDS}s",)
    async with scene(version, [workers], cluster, pki, emulator, tmp_path,
                     flags=unneeded) as running:  # fmt: skip
        ca = running.ca
        await wait_all_running(cluster, ca, 6, "the pods never ran")
        groups = await managed_server_groups(emulator)
        assert sorted(len(g["servers"]) for g in groups) == [2, 4], groups
        servers = {s["uuid"] for s in await emulator.admin.servers()}
        assert {m["uuid"] for g in groups for m in g["servers"]} == servers
        await scale_load(cluster, 0)

        async def all_gone() -> bool:
            ca.alive()
            return not await emulator.admin.servers() and not await managed_server_groups(emulator)

        await wait_until(all_gone, 120, "servers or server groups were left at zero")


# --- node groups changed while serving (issue 33) --------------------------------------------


def rewrite(config: Path, groups: list[dict[str, Any]]) -> None:
    """The provider's config file with other node groups, replaced at once (a rename)."""
    document = yaml.safe_load(config.read_text())
    document["nodeGroups"] = groups
    new = config.with_suffix(".new")
    new.write_text(yaml.safe_dump(document, sort_keys=False))
    new.replace(config)


@pytest.mark.parametrize("version", NEWEST)
async def test_node_groups_change_while_the_provider_serves(
    version: str, cluster: Cluster, pki: PKI, emulator: RunningEmulator, tmp_path: Path
) -> None:
    """Six pods, one per node. workers at maxSize 2 runs two; an invalid edit of the config is
    refused while CA's loop goes on without an error from us; maxSize 4 lets CA scale the group
    to 4; a group added live takes the last two. The same provider process all along."""
    await load(cluster, 6)
    async with scene(version, [group("workers", maxSize=2)], cluster, pki, emulator,
                     tmp_path) as running:  # fmt: skip
        ca, provider = running.ca, running.provider
        pid = provider.process.pid
        await wait_servers(emulator, ca, 2)
        errors_before = ca_errors(ca)
        rewrite(running.config, [group("workers", maxSize=-1)])
        await wait_until(lambda: _said(provider, "refused, the running configuration is kept"),
                         30, "the invalid config was never refused")  # fmt: skip
        loops = ca.output.count(LOOP)
        await wait_until(lambda: _loops_since(ca, loops, 3), 60, "CA's loop stopped")
        assert ca_errors(ca) == errors_before, "CA saw an error from the provider"
        assert len(await emulator.admin.servers()) == 2
        rewrite(running.config, [group("workers", maxSize=4)])
        await wait_servers(emulator, ca, 4)
        rewrite(running.config, [group("workers", maxSize=4), group("extra", maxSize=2)])
        await wait_all_running(cluster, ca, 6, "the pods never ran on the added group")
        assert len(await servers_of(emulator, "extra")) == 2
        assert len(await servers_of(emulator, "workers")) == 4
        assert provider.process.pid == pid and provider.process.returncode is None


async def wait_servers(emulator: RunningEmulator, ca: Autoscaler, count: int) -> None:
    async def there() -> bool:
        ca.alive()
        return len(await emulator.admin.servers()) == count

    await wait_until(there, 90, f"never {count} servers:\n{ca.complaints()}")


# What CA logs (at --v=2) at the start of each loop.
LOOP = "Autoscaler loop triggered"


def ca_errors(ca: Autoscaler) -> list[str]:
    """CA's error lines about its cloud provider (klog's E)."""
    lines = ca.output.splitlines()
    return [e for e in lines if e.startswith("E") and ("externalgrpc" in e or "rpc error" in e)]


async def _said(provider: ServeProcess, text: str) -> bool:
    return text in provider.output


async def _loops_since(ca: Autoscaler, loops: int, more: int) -> bool:
    ca.alive()
    return ca.output.count(LOOP) >= loops + more
