"""Template drift: what a group's template node promises against what its live Nodes report.

Pure functions over Node objects in their JSON form (the template as `node_to_dict` prints it,
live Nodes as the API returns them), so the rules are table-tested without a cluster.

What is compared, and why:
- allocatable of cpu, memory, ephemeral-storage, pods and nvidia.com/gpu: what the scheduler
  and CA's simulation fit pods into. A difference counts when it exceeds the tolerance relative
  to the template (default 3%). A resource the node does not report counts as 0.
- capacity of the same resources, for information only (gauge and table, never a warning or
  the verdict): the template's capacity is the flavor's memory and the volume's size, while a
  real node reports a few percent less (the kernel keeps memory, the file system metadata), and
  no config setting changes a node's capacity. What those losses cost shows in allocatable, and
  the kubelet reservations that absorb them are what the advice names.
- the template's labels, except kubernetes.io/hostname (it names each node): pods selecting on
  a label the template promises but nodes lack trigger scale-ups that never help.
- only settled nodes: Ready, and initialized by the cloud controller manager.
- taints, both ways, ignoring those Kubernetes and CA set and remove on their own (not-ready,
  unreachable, uninitialized, pressure, CA's deletion marks, and CA's startup, ignore and
  status taint prefixes, which CA also drops from templates): a taint only one side has makes
  CA's simulation and the scheduler disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from cloudscale_autoscaler.settings.types import NodeGroupConfig
from cloudscale_autoscaler.template.allocatable import (
    CPU,
    EPHEMERAL_STORAGE,
    FORMATS,
    MEMORY,
    NVIDIA_GPU,
    PODS,
)
from cloudscale_autoscaler.template.labels import (
    LABEL_HOSTNAME,
    LABEL_INSTANCE_TYPE,
    LABEL_REGION,
    LABEL_ZONE,
)
from cloudscale_autoscaler.template.quantity import format_quantity, parse_quantity

RESOURCES = (CPU, MEMORY, EPHEMERAL_STORAGE, PODS, NVIDIA_GPU)
STATUS_FIELDS = ("capacity", "allocatable")
# The status field whose differences are drift; the other (capacity) is informational.
VERDICT_FIELD = "allocatable"
ABSENT = "(absent)"
UNINITIALIZED = "node.cloudprovider.kubernetes.io/uninitialized"
# Taints that come and go with a node's state, set by Kubernetes controllers or CA itself.
TRANSIENT_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
        "node.kubernetes.io/out-of-service",
        UNINITIALIZED,
        "node.cloudprovider.kubernetes.io/shutdown",
        "ToBeDeletedByClusterAutoscaler",
        "DeletionCandidateOfClusterAutoscaler",
    }
)
# Prefixes of taints CA itself leaves out of templates built from live nodes (its taints
# package: IgnoreTaintPrefix, StartupTaintPrefix, StatusTaintPrefix): startup and status taints
# that come and go on a working node.
TRANSIENT_TAINT_PREFIXES = (
    "ignore-taint.cluster-autoscaler.kubernetes.io/",
    "startup-taint.cluster-autoscaler.kubernetes.io/",
    "status-taint.cluster-autoscaler.kubernetes.io/",
)
# Labels that differ per node by design.
PER_NODE_LABELS = frozenset({LABEL_HOSTNAME})
# Advice amounts are rounded up to these steps, so "raise by" is enough, never short.
_STEP = {CPU: Fraction(1, 1000), MEMORY: Fraction(2**20), EPHEMERAL_STORAGE: Fraction(2**20)}

Node = Mapping[str, Any]


@dataclass(frozen=True)
class Difference:
    """One field where a live node differs from the template."""

    field: str  # "allocatable.memory", 'labels["role"]', 'taints["dedicated:NoSchedule"]'
    template: str  # as the template says it, or ABSENT
    live: str  # as the node reports it, or ABSENT
    # (live - template) / template for resources (-1: the node lacks it); None otherwise.
    ratio: float | None = None


def relative_difference(template: Fraction, live: Fraction) -> float:
    if template == 0:
        return 0.0 if live == 0 else 1.0
    return float((live - template) / template)


def _quantities(node: Node, field: str) -> Mapping[str, str]:
    status = node.get("status") or {}
    return status.get(field) or {}


@dataclass(frozen=True)
class ResourceComparison:
    field: str  # "allocatable.memory"
    template: str
    live: str
    ratio: float


def compare_resources(template: Node, live: Node) -> list[ResourceComparison]:
    """Every compared resource the template or the node has, within tolerance or not."""
    found = []
    for field in STATUS_FIELDS:
        promised, reported = _quantities(template, field), _quantities(live, field)
        for resource in RESOURCES:
            if resource not in promised and resource not in reported:
                continue
            want = parse_quantity(promised.get(resource, "0"))
            have = parse_quantity(reported.get(resource, "0"))
            found.append(
                ResourceComparison(
                    f"{field}.{resource}",
                    promised.get(resource, ABSENT),
                    reported.get(resource, ABSENT),
                    relative_difference(want, have),
                )
            )
    return found


def informational(field: str) -> bool:
    """A resource field shown but never counted as drift (capacity: see the module doc)."""
    kind, dot, _ = field.partition(".")
    return bool(dot) and kind in STATUS_FIELDS and kind != VERDICT_FIELD


def resource_differences(template: Node, live: Node, tolerance: float) -> list[Difference]:
    return [
        Difference(c.field, c.template, c.live, c.ratio)
        for c in compare_resources(template, live)
        if abs(c.ratio) > tolerance and not informational(c.field)
    ]


def _labels(node: Node) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def label_differences(template: Node, live: Node) -> list[Difference]:
    have = _labels(live)
    return [
        Difference(f'labels["{key}"]', value, have.get(key, ABSENT))
        for key, value in sorted(_labels(template).items())
        if key not in PER_NODE_LABELS and have.get(key) != value
    ]


def _taints(node: Node) -> dict[str, str]:
    """(key:effect) -> value, transient taints left out."""
    taints = (node.get("spec") or {}).get("taints") or []
    return {
        f"{t['key']}:{t.get('effect', '')}": t.get("value", "")
        for t in taints
        if not transient(str(t.get("key", "")))
    }


def transient(key: str) -> bool:
    return key in TRANSIENT_TAINTS or key.startswith(TRANSIENT_TAINT_PREFIXES)


def taint_differences(template: Node, live: Node) -> list[Difference]:
    promised, reported = _taints(template), _taints(live)
    return [
        Difference(f'taints["{key}"]', promised.get(key, ABSENT), reported.get(key, ABSENT))
        for key in sorted(promised.keys() | reported.keys())
        if promised.get(key) != reported.get(key)
    ]


def settled(node: Node) -> bool:
    """Ready, and initialized by the cloud controller manager: a node still coming up lacks
    the CCM's labels and may report partial status, which is not drift."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if any(t.get("key") == UNINITIALIZED for t in spec.get("taints") or []):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


KINDS = ("resources", "labels", "taints")


def kind_of(field: str) -> str:
    """Which kind of difference a field is: resources, labels or taints."""
    if field.startswith("labels["):
        return "labels"
    if field.startswith("taints["):
        return "taints"
    return "resources"


def compare_node(template: Node, live: Node, tolerance: float) -> list[Difference]:
    """Every difference between the template and one live node."""
    return [
        *resource_differences(template, live, tolerance),
        *label_differences(template, live),
        *taint_differences(template, live),
    ]


@dataclass(frozen=True)
class GroupDrift:
    """One field of one group over all its nodes: the worst node, and how many differ."""

    group: str
    field: str
    node: str
    difference: Difference
    nodes_differing: int
    nodes_compared: int
    advice: str


def _severity(difference: Difference) -> float:
    return math.inf if difference.ratio is None else abs(difference.ratio)


def summarize(
    group: NodeGroupConfig,
    index: int,
    nodes: Sequence[tuple[str, Sequence[Difference]]],
) -> list[GroupDrift]:
    """Per field of the group, the node that differs most (ties: first by name)."""
    by_field: dict[str, list[tuple[str, Difference]]] = {}
    for name, differences in sorted(nodes):
        for difference in differences:
            by_field.setdefault(difference.field, []).append((name, difference))
    result = []
    for field, hits in by_field.items():
        name, worst = max(hits, key=lambda hit: _severity(hit[1]))
        result.append(
            GroupDrift(
                group.name, field, name, worst, len(hits), len(nodes), advise(worst, group, index)
            )
        )
    return result


# --- what to change in the config ---------------------------------------------------------


def _amount(resource: str, template: str, live: str) -> str:
    """|live - template| rounded up to a step an operator would write."""
    delta = abs(parse_quantity(_zero(live)) - parse_quantity(_zero(template)))
    step = _STEP.get(resource)
    if step is not None:
        delta = math.ceil(delta / step) * step
    return format_quantity(delta, FORMATS.get(resource, "DecimalSI"))


def _zero(value: str) -> str:
    return "0" if value == ABSENT else value


def advise(difference: Difference, group: NodeGroupConfig, index: int) -> str:
    at = f"nodeGroups[{index}]"
    field = difference.field
    if field.startswith("labels["):
        return _label_advice(field[len('labels["') : -2], difference, at)
    if field.startswith("taints["):
        return _taint_advice(field[len('taints["') : -2], difference, at)
    _, _, resource = field.partition(".")
    return _resource_advice(resource, difference, group, at)


def _resource_advice(resource: str, difference: Difference, group: NodeGroupConfig, at: str) -> str:
    """Advice for an allocatable difference: the kubelet reservations (or the group's shape)."""
    amount = _amount(resource, difference.template, difference.live)
    short = (difference.ratio or 0) < 0
    if resource == PODS:
        return f"set {at}.kubelet.maxPods to {difference.live} (what the kubelet runs with)"
    if resource == NVIDIA_GPU:
        if difference.live == ABSENT:
            return "run the NVIDIA device plugin on the group's nodes (they report no GPU)"
        return f"the nodes report {difference.live} GPUs: check {at}.flavor ({group.flavor})"
    volume = (
        f" (or set {at}.volumeSizeGB to the servers' root volume size)"
        if resource == EPHEMERAL_STORAGE
        else ""
    )
    if short:
        return f"raise {at}.kubelet.systemReserved.{resource} by {amount}{volume}"
    return (
        f"lower {at}.kubelet reservations of {resource} (systemReserved, kubeReserved, "
        f"evictionHard) by {amount}{volume}"
    )


def _label_advice(key: str, difference: Difference, at: str) -> str:
    live = difference.live
    if key == LABEL_INSTANCE_TYPE:
        if live == ABSENT:
            return "the cloud controller manager sets this label: check that it runs"
        return f"the nodes run flavor {live}: set {at}.flavor to {live}"
    if key in (LABEL_ZONE, LABEL_REGION):
        if live == ABSENT:
            return "the cloud controller manager sets this label: check that it runs"
        return f"the nodes are in {live}: set {at}.zone to match"
    labels_at = f'{at}.labels["{key}"]'
    if live == ABSENT:
        return (
            f"add the label to {labels_at} if missing, and pass ${{node_labels}} to the "
            f"kubelet's --node-labels in {at}.userData"
        )
    return f'the nodes say "{live}": set {labels_at} to it, or fix the kubelet\'s --node-labels'


def _taint_advice(key: str, difference: Difference, at: str) -> str:
    if difference.live == ABSENT:
        return f"pass ${{node_taints}} to the kubelet's --register-with-taints in {at}.userData"
    name, _, effect = key.rpartition(":")
    if difference.template == ABSENT:
        return (
            f"add {{key: {name}, value: {difference.live!r}, effect: {effect}}} to "
            f"{at}.taints, or stop the nodes from registering with it"
        )
    return f"set the taint's value in {at}.taints to {difference.live!r}"


def format_ratio(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:+.1%}"


def warning_line(drift: GroupDrift) -> str:
    """The log line for one group and field."""
    diff = drift.difference
    ratio = format_ratio(diff.ratio)
    return (
        f"template drift in node group {drift.group}, {drift.field}: template {diff.template}, "
        f"node {drift.node} reports {diff.live}{f' ({ratio})' if ratio else ''}; "
        f"{drift.nodes_differing} of {drift.nodes_compared} nodes differ; {drift.advice}"
    )
