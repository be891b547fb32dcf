"""The template v1.Node a node group's next server would become (NodeGroupTemplateNodeInfo).

Pure and deterministic: the same config and flavor always give the same Node and the same bytes
(no timestamps, no random names), so CA's cache and our tests see stable templates.

Decisions, with the reasons:
- Name and hostname are `template-<group>`. CA renames the node to
  `template-node-for-<group>-<random>` and overwrites the hostname label anyway.
- spec.providerID stays EMPTY. CA's sanitation leaves it untouched, the in-tree providers
  (hetzner, clusterapi, ...) leave it empty too, and a made-up `cloudscale://...` ID would look
  like a real instance to anything that matches instances to nodes by provider ID.
- Labels are what the kubelet and the cloudscale CCM put on a real node plus what userData
  must pass with ${node_labels} (the GPU label, the group's labels); labels.py decides which
  is which, so the template promises nothing a real node will not carry. A group without a
  zone gets no zone/region labels (a wrong zone label is worse than none).
- GPU flavors carry `<gpuLabel>=<model>` (see labels.gpu_label_value) and nvidia.com/gpu in
  capacity and allocatable.
- Annotations name the cluster and group, so NodePrice (which receives only name, labels and
  annotations of a sanitised template) can tell groups apart without parsing CA's node name.
- Status: a Ready condition (reason KubeletReady) and the three pressure conditions False, as a
  healthy kubelet reports them; no timestamps (determinism); phase Running; nodeInfo linux/amd64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.template.allocatable import (
    node_allocatable,
    node_capacity,
    quantity_strings,
)
from cloudscale_autoscaler.template.labels import (
    ARCH,
    OS,
    label_sources,
    template_name,
)

if TYPE_CHECKING:
    # Annotations only: at run time template/ needs nothing of the config package, which
    # imports template/ to check labels and quantities.
    from cloudscale_autoscaler.settings.types import NodeGroupConfig

ANNOTATION_CLUSTER = "autoscaler.cloudscale.ch/cluster"
ANNOTATION_GROUP = "autoscaler.cloudscale.ch/node-group"

# (type, status, reason, message) of a healthy kubelet's conditions.
_CONDITIONS = (
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
)


def template_labels(group: NodeGroupConfig, flavor: Flavor, gpu_label: str) -> dict[str, str]:
    """The template's labels: set by the kubelet, by the CCM, or passed with ${node_labels}."""
    return label_sources(group, flavor, gpu_label).template()


def build_template_node(
    cluster: str, group: NodeGroupConfig, flavor: Flavor, gpu_label: str
) -> core_v1_pb2.Node:
    """The v1.Node a fresh server of this group would register as, seen by the scheduler."""
    node = core_v1_pb2.Node()
    node.metadata.name = template_name(group.name)
    node.metadata.labels.update(template_labels(group, flavor, gpu_label))
    node.metadata.annotations[ANNOTATION_CLUSTER] = cluster
    node.metadata.annotations[ANNOTATION_GROUP] = group.name

    node.spec.SetInParent()  # present even without taints, as Go always writes it
    for taint in group.taints:
        node.spec.taints.add(key=taint.key, value=taint.value, effect=taint.effect)

    capacity = node_capacity(flavor, group.volume_size_gb, group.kubelet.max_pods)
    allocatable = node_allocatable(capacity, group.kubelet)
    for resource, text in quantity_strings(capacity).items():
        node.status.capacity[resource].string = text
    for resource, text in quantity_strings(allocatable).items():
        node.status.allocatable[resource].string = text

    node.status.phase = "Running"
    for type_, status, reason, message in _CONDITIONS:
        node.status.conditions.add(type=type_, status=status, reason=reason, message=message)
    node.status.nodeInfo.operatingSystem = OS
    node.status.nodeInfo.architecture = ARCH
    return node


def template_node_bytes(
    cluster: str, group: NodeGroupConfig, flavor: Flavor, gpu_label: str
) -> bytes:
    """The template Node proto-marshalled like Go does it: map entries sorted by key."""
    node = build_template_node(cluster, group, flavor, gpu_label)
    return node.SerializeToString(deterministic=True)
