"""The real Cluster Autoscaler against our real `serve` process, on a loopback cluster
(kube-apiserver, kube-controller-manager, kube-scheduler, kwok; tests/fixtures/cluster.py).

A small stand-in plays the cloudscale cloud controller manager and the kubelet: for every
running server of the emulator a Node named like the server, `spec.providerID:
cloudscale://<uuid>`, the CCM's instance-type/zone/region labels and the flavor's capacity,
kept Ready by kwok (docs/conformance.md lists what it assumes). What is asserted is what CA
decided (its log, its status ConfigMap) and what the cloud holds.
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
GROUP = {"name": "workers", "minSize": 0, "maxSize": 5, "flavor": "flex-4-2",
         "image": "debian-12", "zone": "lpg1"}  # fmt: skip
# flex-4-2: 2 vCPUs, so one of these pods per node: CA's estimator asks for one node each.
POD_CPU = "1500m"
PODS = 3
UNNEEDED_SECONDS = 5


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with (
        tempfile.TemporaryDirectory(prefix="ca-cluster-") as directory,
        running_kube(Path(directory)) as kube,
        running_cluster(kube, Path(directory), nodes=0) as running,
    ):
        yield running


def node_for(server: dict[str, Any]) -> dict[str, Any]:
    """What the CCM and the kubelet register for a booted flex-4-2 server (kubelet defaults:
    no reservations, evictionHard memory.available 100Mi, 110 pods)."""
    zone = server["zone"]["slug"]
    return {
        "metadata": {
            "name": server["name"],
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": server["name"],
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": server["flavor"]["slug"],
                "topology.kubernetes.io/zone": zone,
                "topology.kubernetes.io/region": zone.rstrip("0123456789"),
            },
        },
        "spec": {"providerID": f"cloudscale://{server['uuid']}"},
        "status": {
            "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "3996Mi", "pods": "110"},
        },
    }


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


@pytest.fixture
async def provider(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> AsyncIterator[ServeProcess]:
    config = write_config(tmp_path / "provider", pki, emulator.url, TOKEN, cluster=CLUSTER,
                          groups=[GROUP])  # fmt: skip
    process = await start_serve(config, log_level="info")
    yield process
    await process.kill()


def start_autoscaler(
    version: str, cluster: Cluster, provider: ServeProcess, pki: PKI, directory: Path
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
        "--namespace=kube-system", "--leader-elect=false", "--scan-interval=2s",
        "--scale-down-delay-after-add=0s", f"--scale-down-unneeded-time={UNNEEDED_SECONDS}s",
        "--scale-down-delay-after-delete=0s", "--max-node-provision-time=2m",
        f"--address=127.0.0.1:{free_port()}", "--v=2", "--logtostderr",
    ]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return Autoscaler(process, log)


async def workers(emulator: RunningEmulator) -> list[dict[str, Any]]:
    return [
        s for s in await emulator.admin.servers()
        if s["tags"].get(TAG_CLUSTER) == CLUSTER and s["tags"].get(TAG_GROUP) == "workers"
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


@pytest.mark.parametrize("version", list(GENERATIONS))
async def test_scale_from_zero_then_down_as_ca_decides(
    version: str,
    cluster: Cluster,
    provider: ServeProcess,
    pki: PKI,
    emulator: RunningEmulator,
    tmp_path: Path,
) -> None:
    apps = k8s.AppsV1Api(cluster.kube.client())
    await asyncio.to_thread(apps.create_namespaced_deployment, "default", pending_pods(PODS))
    stand_in = asyncio.create_task(kubelets(cluster, emulator))
    ca = start_autoscaler(version, cluster, provider, pki, tmp_path)
    try:

        async def all_running() -> bool:
            if ca.process.poll() is not None:
                raise AssertionError(f"CA exited {ca.process.returncode}:\n{ca.output[-4000:]}")
            pods = await asyncio.to_thread(
                cluster.core().list_namespaced_pod, "default", label_selector="app=load"
            )
            return len(pods.items) == PODS and all(p.status.phase == "Running" for p in pods.items)

        await wait_until(all_running, 120, "the pending pods never ran on new nodes")
        assert len(await workers(emulator)) == PODS, "one node per pod, as CA's estimator asked"
        assert "workers 0->3 (max: 5)" in ca.output, ca.output[-4000:]
        status = await asyncio.to_thread(
            cluster.core().read_namespaced_config_map, "cluster-autoscaler-status", "kube-system"
        )
        assert "workers" in yaml.safe_dump(status.data)

        # Two pods go: their nodes are idle, CA deletes them after the unneeded time.
        await asyncio.to_thread(
            apps.patch_namespaced_deployment, "load", "default", {"spec": {"replicas": 1}}
        )
        idle_since = asyncio.get_running_loop().time()

        async def one_left() -> bool:
            return len(await workers(emulator)) == 1

        await wait_until(one_left, 120, "CA never scaled the idle nodes down")
        waited = asyncio.get_running_loop().time() - idle_since
        assert waited >= UNNEEDED_SECONDS, "deleted before they were unneeded long enough"
        assert "Scale-down: removing empty node" in ca.output or "removing node" in ca.output
    finally:
        stand_in.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stand_in
        ca.process.terminate()
        ca.process.wait(30)
        await asyncio.to_thread(apps.delete_namespaced_deployment, "load", "default")
