"""Kubernetes Nodes for the emulator's servers, as the cloud controller manager and a kubelet
would register them, and Ready from the start.

Nothing runs on them and nothing keeps them alive: no kubelet or kwok heartbeats, no
kube-controller-manager whose node lifecycle controller would mark them unready without one.
The Cluster Autoscaler reads a Node's readiness from its Ready condition and its taints, not
from heartbeats, so they stay Ready, and the apiserver and etcd spend nothing on them while
CA and our server are measured (kwok's heartbeat stage would rewrite every Node's status every
20-45 s: at N=5,000 over a hundred writes a second, each one an update CA's informer handles).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from bench.realca.testbed import Kube
from bench.stack import FLAVOR, ZONE, Population
from cloudscale_autoscaler.template.slug import flavor_from_slug

# Parallel API requests while registering: the apiserver and etcd, not this client, set the pace.
WORKERS = 8
# The kubelet's defaults: no reservations, evictionHard memory.available 100Mi, 110 pods.
EVICTION_HARD_MI = 100
MAX_PODS = "110"
DELETE_TIMEOUT = 120.0


def node_names(population: Population) -> dict[str, str]:
    """Node name -> provider ID for every server CA sees as a Node: ours and the static
    (untagged) ones. Names carry the whole uuid: its first 8 characters collide at N=5,000."""
    own = [u for uuids in population.own.values() for u in uuids]
    names = {f"node-{u}": f"cloudscale://{u}" for u in own}
    names.update({f"static-{u}": f"cloudscale://{u}" for u in population.untagged})
    return names


@dataclass(frozen=True)
class Extras:
    """What a run adds to its Nodes: annotations (kwok's, for a cluster whose node lifecycle
    controller wants heartbeats) and taints (keeping other Pods off Nodes that run nothing)."""

    annotations: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)


NO_EXTRAS = Extras()


def node_manifest(
    name: str, provider_id: str, now: str, extras: Extras = NO_EXTRAS
) -> dict[str, Any]:
    flavor = flavor_from_slug(FLAVOR)
    if flavor is None:
        raise ValueError(f"bench flavor {FLAVOR!r} is not a flavor slug")
    memory_mi = flavor.memory_gb * 1024
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
             "lastTransitionTime": now}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": extras.annotations,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": FLAVOR,
                "topology.kubernetes.io/zone": ZONE,
                "topology.kubernetes.io/region": ZONE.rstrip("0123456789"),
            },
        },
        "spec": {"providerID": provider_id},
        "status": {
            "capacity": {"cpu": str(flavor.vcpu_count), "memory": f"{memory_mi}Mi",
                         "pods": MAX_PODS},
            "allocatable": {"cpu": str(flavor.vcpu_count),
                            "memory": f"{memory_mi - EVICTION_HARD_MI}Mi", "pods": MAX_PODS},
            "conditions": [ready],
        },
    }  # fmt: skip


def api(kube: Kube) -> k8s.CoreV1Api:
    """A client as the admin, with a connection per worker (urllib3 keeps 4 by default)."""
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(
        config_file=str(kube.admin_kubeconfig), client_configuration=configuration
    )
    configuration.connection_pool_maxsize = WORKERS
    return k8s.CoreV1Api(k8s.ApiClient(configuration))


def _drain(response: Any) -> None:
    """Reads a raw answer and gives its connection back to the pool."""
    response.read()
    response.release_conn()


def _register(core: k8s.CoreV1Api, name: str, provider_id: str, now: str, extras: Extras) -> None:
    # _preload_content=False: the answer is not needed, and decoding it into models costs more
    # than the request.
    manifest: Any = node_manifest(name, provider_id, now, extras)  # sent as it is
    _drain(core.create_node(manifest, _preload_content=False))
    # The TaintNodesByCondition admission plugin gives every new Node the not-ready taint;
    # the node lifecycle controller would lift it, and none may run. CA counts a Node with
    # that taint as not ready.
    lift = [{"op": "add", "path": "/spec/taints", "value": extras.taints}]
    _drain(core.patch_node(name, lift, _preload_content=False))


def register(core: k8s.CoreV1Api, nodes: dict[str, str], extras: Extras = NO_EXTRAS) -> None:
    """Creates the Nodes (name -> provider ID), Ready, with only the taints of `extras`."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with ThreadPoolExecutor(WORKERS) as pool:
        # list(): the first failure is raised here, with its API error.
        list(pool.map(lambda i: _register(core, i[0], i[1], now, extras), nodes.items()))


def remove_all(core: k8s.CoreV1Api) -> None:
    """Deletes every Node and waits until none is left."""
    core.delete_collection_node()
    deadline = time.monotonic() + DELETE_TIMEOUT
    while core.list_node(limit=1).items:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Nodes were still listed {DELETE_TIMEOUT:.0f}s after deleting")
        time.sleep(0.5)


def _ready(node: k8s.V1Node, taints: list[dict[str, str]]) -> bool:
    """Ready and with only `taints`, as CA wants a Node to count it ready."""
    conditions = (node.status.conditions if node.status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    keys = {(t.key, t.effect) for t in (node.spec.taints if node.spec else None) or []}
    return ready and keys == {(t["key"], t["effect"]) for t in taints}


def not_ready(core: k8s.CoreV1Api, names: Iterable[str], extras: Extras = NO_EXTRAS) -> list[str]:
    """The Nodes among `names` that are missing, not Ready or tainted otherwise than
    `extras` says."""
    listed = {n.metadata.name: n for n in core.list_node().items if n.metadata}
    return [n for n in names if n not in listed or not _ready(listed[n], extras.taints)]
