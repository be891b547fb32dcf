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
- everything else (the GPU label, the group's labels, or a group label that overrides a value
  the kubelet or CCM would set) must be passed to the kubelet: `${node_labels}` in userData.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.config import NodeGroupConfig

LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_REGION = "topology.kubernetes.io/region"

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
    if flavor.gpu is not None and flavor.gpu.count > 0:
        wanted[gpu_label] = gpu_label_value(flavor.gpu.name)
    wanted.update(group.labels)  # explicit configuration wins
    node_labels: dict[str, str] = {}
    for key, value in wanted.items():
        for automatic in (kubelet, ccm):
            if key in automatic:
                if automatic[key] == value:
                    break  # set anyway, to this very value
                del automatic[key]  # overridden: only --node-labels can set this value
        else:
            node_labels[key] = value
    return LabelSources(kubelet, ccm, node_labels)
