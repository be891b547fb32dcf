"""Which of a template's labels reach a real node, and how (pure).

A template promises labels; CA schedules pods on the template, so every one of them must be on
the real node, or a pod selecting on it triggers scale-ups that never help (for the GPU label:
CA treats a booting GPU node without the label as ready, and scales up twice). Each label gets
there one of three ways:

- the kubelet sets it itself: kubernetes.io/os, kubernetes.io/arch, kubernetes.io/hostname
  (CA replaces the template's hostname anyway);
- the cloudscale cloud controller manager sets it from the server (its InstanceMetadata:
  InstanceType = flavor slug, Zone = zone slug, Region = zone slug without trailing digits),
  which Kubernetes' node controller writes as node.kubernetes.io/instance-type and
  topology.kubernetes.io/zone / region;
- everything else (the GPU label, the pool label of a group fanned out by `zones`, the
  group's labels) must be passed to the kubelet: `${node_labels}` in userData.

A group label on a key the kubelet or the CCM sets may only repeat their value (label_error),
so the three sources never disagree; and the kubelet refuses most keys in the kubernetes.io
and k8s.io namespaces (self_set_error).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cloudscale_autoscaler.cloud.models import Flavor

if TYPE_CHECKING:
    # Annotations only: at run time template/ needs nothing of the config package, which
    # imports template/ to check labels and quantities.
    from cloudscale_autoscaler.settings.types import NodeGroupConfig

LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"
# On every node of a group fanned out by `zones`, with the entry's name: the same in every
# zone, so CA's --balancing-label can tell the zones' groups are one pool.
LABEL_POOL = "autoscaler.cloudscale.ch/pool"
# The deprecated keys the CCM's node controller still writes next to the GA ones.
_BETA_INSTANCE_TYPE = "beta.kubernetes.io/instance-type"
_BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
_BETA_REGION = "failure-domain.beta.kubernetes.io/region"

# What the kubelet accepts through --node-labels in the kubernetes.io and k8s.io namespaces
# (k8s.io/kubelet/pkg/apis IsKubeletLabel, checked by the kubelet's flag validation): these
# keys, and keys whose prefix is or ends in one of the namespaces below.
_KUBELET_ALLOWED = frozenset(
    {
        LABEL_HOSTNAME,
        LABEL_OS,
        LABEL_ARCH,
        LABEL_INSTANCE_TYPE,
        LABEL_ZONE,
        LABEL_REGION,
        _BETA_INSTANCE_TYPE,
        _BETA_ZONE,
        _BETA_REGION,
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    }
)
_KUBELET_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
_RESERVED_NAMESPACES = ("kubernetes.io", "k8s.io")

OS = "linux"
ARCH = "amd64"  # every cloudscale.ch flavor is x86-64
UNKNOWN_GPU = "unknown"
_LABEL_VALUE_MAX = 63
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")
# The template shows its computed labels first, in this order.
_ORDER = (LABEL_OS, LABEL_ARCH, LABEL_INSTANCE_TYPE, LABEL_ZONE, LABEL_REGION, LABEL_HOSTNAME)


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


@dataclass(frozen=True)
class LabelSources:
    kubelet: dict[str, str]
    ccm: dict[str, str]
    node_labels: dict[str, str]  # what ${node_labels} must carry

    def template(self) -> dict[str, str]:
        """The template's labels: the union of the three (they never share a key), the
        computed ones first in a fixed order, then the group's own."""
        merged = {**self.kubelet, **self.ccm, **self.node_labels}
        first = {key: merged.pop(key) for key in _ORDER if key in merged}
        return {**first, **merged}


def label_sources(group: NodeGroupConfig, flavor: Flavor, gpu_label: str) -> LabelSources:
    kubelet = {LABEL_OS: OS, LABEL_ARCH: ARCH, LABEL_HOSTNAME: template_name(group.name)}
    ccm = {LABEL_INSTANCE_TYPE: flavor.slug}
    if group.zone:
        # Without a zone the server lands in the project's default zone, which we do not know:
        # the CCM will label it, the template promises nothing.
        ccm[LABEL_ZONE] = group.zone
        ccm[LABEL_REGION] = region_of(group.zone)
    wanted: dict[str, str] = {}
    if group.pool is not None:
        wanted[LABEL_POOL] = group.pool
    if flavor.gpu is not None and flavor.gpu.count > 0:
        wanted[gpu_label] = gpu_label_value(flavor.gpu.name)
    wanted.update(group.labels)  # explicit configuration wins
    # The kubelet or the CCM sets these keys, to the value the configuration must repeat.
    node_labels = {k: v for k, v in wanted.items() if k not in kubelet and k not in ccm}
    return LabelSources(kubelet, ccm, node_labels)


def _in_namespace(prefix: str, namespaces: tuple[str, ...]) -> bool:
    return any(prefix == ns or prefix.endswith("." + ns) for ns in namespaces)


def self_set_error(key: str) -> str | None:
    """Why the kubelet cannot set label `key` on its own node, or None."""
    prefix = key.rpartition("/")[0]
    if not _in_namespace(prefix, _RESERVED_NAMESPACES) or key in _KUBELET_ALLOWED:
        return None
    if _in_namespace(prefix, _KUBELET_NAMESPACES):
        return None
    return (
        f"the kubelet refuses to start with {key} in --node-labels (a node may set labels in "
        "the kubernetes.io and k8s.io namespaces only under kubelet.kubernetes.io/ and "
        "node.kubernetes.io/ and a few well-known keys), so it cannot come through "
        "${node_labels}: set such labels another way, or use a prefix of your own "
        "(node-role.example.com/worker)"
    )


def label_error(key: str, value: str, flavor: str, zone: str | None) -> str | None:
    """Why a group label cannot be promised by the group's template, or None: the kubelet
    refuses it, or the kubelet or the CCM writes that key with another value (equal: fine)."""
    ccm = "the cloud controller manager sets it on every new node"
    if key in (LABEL_INSTANCE_TYPE, _BETA_INSTANCE_TYPE) and value != flavor:
        return f'{ccm} to the server\'s flavor, "{flavor}", not "{value}"'
    if key in (LABEL_ZONE, _BETA_ZONE, LABEL_REGION, _BETA_REGION):
        if zone is None:
            return f"{ccm} from the server's zone: set the group's zone instead"
        expected = zone if key in (LABEL_ZONE, _BETA_ZONE) else region_of(zone)
        if value != expected:
            return f'{ccm} from the server\'s zone, to "{expected}", not "{value}"'
    if key == LABEL_HOSTNAME:
        return "the kubelet sets it to each node's own host name"
    own = {LABEL_OS: OS, LABEL_ARCH: ARCH}.get(key)
    if own is not None and value != own:
        return f'the kubelet sets it to "{own}" on every cloudscale.ch node, not "{value}"'
    return self_set_error(key)


def gpu_label_error(key: str) -> str | None:
    """Why `key` cannot carry the GPU type on the nodes, or None."""
    if key in _KUBELET_ALLOWED:
        return "a well-known node label the kubelet or the cloud controller manager sets"
    return self_set_error(key)
