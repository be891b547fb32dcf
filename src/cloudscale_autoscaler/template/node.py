"""The template v1.Node a node group's next server would become (NodeGroupTemplateNodeInfo).

Pure and deterministic: the same config and flavor always give the same Node and the same bytes
(no timestamps, no random names), so CA's cache and our tests see stable templates.

Decisions, with the reasons:
- Name and hostname are `template-<group>`. CA renames the node to
  `template-node-for-<group>-<random>` and overwrites the hostname label anyway.
- spec.providerID stays EMPTY. CA's sanitation leaves it untouched, the in-tree providers
  (hetzner, clusterapi, ...) leave it empty too, and a made-up `cloudscale://...` ID would look
  like a real instance to anything that matches instances to nodes by provider ID.
- Labels are what the cloudscale CCM and kubelet put on a real node: kubernetes.io/os,
  kubernetes.io/arch, kubernetes.io/hostname, node.kubernetes.io/instance-type=<flavor>, and
  topology.kubernetes.io/zone / region when the group names a zone. The region is the zone
  without its trailing digits (lpg1 -> lpg), as the CCM derives it. A group without a zone gets
  NO zone/region labels: the server lands in the project's default zone, which we do not know,
  and a wrong zone label is worse than none (set `zone` for zone-aware scheduling).
- GPU flavors carry `<gpuLabel>=<model>` with the model name made a valid label value (see
  gpu_label_value) and nvidia.com/gpu in capacity and allocatable.
- The group's configured labels are applied last and override every computed label: explicit
  configuration wins. Real nodes must carry the same labels (kubelet --node-labels), or pods
  that select on them would trigger scale-ups that never help.
- Annotations name the cluster and group, so NodePrice (which receives only name, labels and
  annotations of a sanitised template) can tell groups apart without parsing CA's node name.
- Status: a Ready condition (reason KubeletReady) and the three pressure conditions False, as a
  healthy kubelet reports them; no timestamps (determinism); phase Running; nodeInfo linux/amd64.
"""

from __future__ import annotations

import re

from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.config import NodeGroupConfig
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.template.allocatable import (
    node_allocatable,
    node_capacity,
    quantity_strings,
)

LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
ANNOTATION_CLUSTER = "autoscaler.cloudscale.ch/cluster"
ANNOTATION_GROUP = "autoscaler.cloudscale.ch/node-group"

OS = "linux"
ARCH = "amd64"  # every cloudscale.ch flavor is x86-64
UNKNOWN_GPU = "unknown"
_LABEL_VALUE_MAX = 63
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")

# (type, status, reason, message) of a healthy kubelet's conditions.
_CONDITIONS = (
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
)


def template_name(group: str) -> str:
    return f"template-{group}"


def region_of(zone: str) -> str:
    """The region slug of a zone slug, as the CCM derives it: lpg1 -> lpg, rma1 -> rma."""
    return zone.rstrip("0123456789") or zone


def gpu_label_value(model: str) -> str:
    """A GPU model name as a label value.

    "NVIDIA RTX PRO 6000 Max-Q" -> "nvidia-rtx-pro-6000-max-q": lowercase; every run of
    characters other than a-z and 0-9 becomes one "-"; no leading or trailing "-"; at most 63
    characters. A name with nothing left becomes "unknown", since the label must still be
    present for CA to see the GPU. Use this same function wherever the label value is needed
    (GetAvailableGPUTypes, the real node's --node-labels) so template and nodes agree.
    """
    value = _NOT_ALNUM.sub("-", model.lower()).strip("-")
    value = value[:_LABEL_VALUE_MAX].rstrip("-")
    return value or UNKNOWN_GPU


def template_labels(group: NodeGroupConfig, flavor: Flavor, gpu_label: str) -> dict[str, str]:
    """The template's labels: well-known ones, the GPU label, then the group's own (which win)."""
    name = template_name(group.name)
    labels = {
        LABEL_OS: OS,
        LABEL_ARCH: ARCH,
        LABEL_INSTANCE_TYPE: flavor.slug,
    }
    if group.zone:
        labels[LABEL_ZONE] = group.zone
        labels[LABEL_REGION] = region_of(group.zone)
    labels[LABEL_HOSTNAME] = name
    if flavor.gpu is not None and flavor.gpu.count > 0:
        labels[gpu_label] = gpu_label_value(flavor.gpu.name)
    labels.update(group.labels)
    return labels


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
