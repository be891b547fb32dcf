"""Template drift rules (kube/drift.py) as tables: template Node vs live Node, in JSON form.

The template side is the real template of a real config (build_template_node + node_to_dict),
so the rules are tested against what the product actually promises CA.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from cloudscale_autoscaler.cloud.models import Flavor, Gpu
from cloudscale_autoscaler.commands.drift import exit_code, render
from cloudscale_autoscaler.kube.check import DriftReport, GroupReport
from cloudscale_autoscaler.kube.drift import (
    ABSENT,
    Difference,
    GroupDrift,
    advise,
    compare_node,
    format_ratio,
    informational,
    kind_of,
    relative_difference,
    settled,
    summarize,
    warning_line,
)
from cloudscale_autoscaler.settings.types import KubeletConfig, NodeGroupConfig, Taint
from cloudscale_autoscaler.template.node import build_template_node
from cloudscale_autoscaler.template.render import node_to_dict

FLEX = Flavor(slug="flex-8-4", name="Flex-8-4", vcpu_count=4, memory_gb=8)
GROUP = NodeGroupConfig(
    name="workers",
    min_size=0,
    max_size=5,
    flavor="flex-8-4",
    image="debian-12",
    zone="lpg1",
    volume_size_gb=50,
    labels=(("role", "worker"),),
    taints=(Taint("dedicated", "batch", "NoSchedule"),),
    kubelet=KubeletConfig(system_reserved=(("memory", "512Mi"),)),
)
TOLERANCE = 0.03
Node = dict[str, Any]


def template() -> Node:
    return node_to_dict(build_template_node("prod", GROUP, FLEX, "cloudscale.ch/gpu"))


def live_twin() -> Node:
    """A live Node as the API returns it, matching the template in everything compared."""
    node = copy.deepcopy(template())
    node["metadata"] = {
        "name": "prod-workers-abc",
        "labels": {
            **node["metadata"]["labels"],
            "kubernetes.io/hostname": "prod-workers-abc",
            "beta.kubernetes.io/os": "linux",
        },
    }
    node["spec"] = {"providerID": "cloudscale://x", "taints": [*node["spec"]["taints"]]}
    node["status"]["capacity"]["hugepages-2Mi"] = "0"  # not compared
    return node


def mutate(path: str, value: Any) -> Callable[[Node], None]:
    """Set (or with value None, delete) a dotted path; a key with dots goes in [...]."""

    def apply(node: Node) -> None:
        parts = [p for p in re.split(r"\.(?![^\[]*\])|\[|\]", path) if p]
        target = node
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        if value is None:
            target.pop(parts[-1], None)
        else:
            target[parts[-1]] = value

    return apply


def test_template_and_twin_have_what_the_rows_change() -> None:
    node = template()
    assert node["status"]["allocatable"]["memory"] == "7580Mi"  # 8Gi - 512Mi - 100Mi
    assert node["metadata"]["labels"]["role"] == "worker"
    assert compare_node(node, live_twin(), TOLERANCE) == []


ROWS: list[tuple[str, Callable[[Node], None], list[Difference]]] = [
    ("identical", lambda n: None, []),
    (
        "allocatable memory 10% short",
        mutate("status.allocatable.memory", "6822Mi"),
        [Difference("allocatable.memory", "7580Mi", "6822Mi", (6822 - 7580) / 7580)],
    ),
    (
        "memory within tolerance (kernel keeps 2%)",
        lambda n: (
            mutate("status.capacity.memory", "8028Mi")(n),
            mutate("status.allocatable.memory", "7428Mi")(n),
        ),
        [],
    ),
    (
        "memory just beyond tolerance",
        mutate("status.allocatable.memory", "7350Mi"),
        [Difference("allocatable.memory", "7580Mi", "7350Mi", (7350 - 7580) / 7580)],
    ),
    (
        "more cpu than promised",
        mutate("status.allocatable.cpu", "8"),
        [Difference("allocatable.cpu", "4", "8", 1.0)],
    ),
    (
        "capacity below the flavor and volume is informational (kernel, file system)",
        lambda n: (
            mutate("status.capacity.memory", "7800Mi")(n),
            mutate("status.capacity.ephemeral-storage", "40Gi")(n),
        ),
        [],
    ),
    (
        "smaller root file system shows in allocatable",
        mutate("status.allocatable.ephemeral-storage", "40Gi"),
        [Difference("allocatable.ephemeral-storage", "45Gi", "40Gi", -1 / 9)],
    ),
    (
        "pods capacity from another maxPods",
        lambda n: (
            mutate("status.capacity.pods", "250")(n),
            mutate("status.allocatable.pods", "250")(n),
        ),
        [Difference("allocatable.pods", "110", "250", (250 - 110) / 110)],
    ),
    (
        "a GPU the template does not promise",
        mutate("status.allocatable[nvidia.com/gpu]", "1"),
        [Difference("allocatable.nvidia.com/gpu", ABSENT, "1", 1.0)],
    ),
    (
        "missing configured label",
        mutate("metadata.labels.role", None),
        [Difference('labels["role"]', "worker", ABSENT)],
    ),
    (
        "label with another value",
        mutate("metadata.labels.role", "batch"),
        [Difference('labels["role"]', "worker", "batch")],
    ),
    (
        "zone label from the CCM differs",
        mutate("metadata.labels[topology.kubernetes.io/zone]", "rma1"),
        [Difference('labels["topology.kubernetes.io/zone"]', "lpg1", "rma1")],
    ),
    (
        "hostname differs by design",
        mutate("metadata.labels[kubernetes.io/hostname]", "other"),
        [],
    ),
    (
        "extra label is fine",
        mutate("metadata.labels.extra", "yes"),
        [],
    ),
    (
        "template taint missing on the node",
        mutate("spec.taints", []),
        [Difference('taints["dedicated:NoSchedule"]', "batch", ABSENT)],
    ),
    (
        "extra taint on the node",
        mutate(
            "spec.taints",
            [
                {"key": "dedicated", "value": "batch", "effect": "NoSchedule"},
                {"key": "gpu", "effect": "NoExecute"},
            ],
        ),
        [Difference('taints["gpu:NoExecute"]', ABSENT, "")],
    ),
    (
        "taint value differs",
        mutate("spec.taints", [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}]),
        [Difference('taints["dedicated:NoSchedule"]', "batch", "web")],
    ),
    (
        "transient taints are ignored",
        mutate(
            "spec.taints",
            [
                {"key": "dedicated", "value": "batch", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                {
                    "key": "node.cloudprovider.kubernetes.io/uninitialized",
                    "value": "true",
                    "effect": "NoSchedule",
                },
                {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"},
                {
                    "key": "startup-taint.cluster-autoscaler.kubernetes.io/cni",
                    "effect": "NoSchedule",
                },
                {
                    "key": "ignore-taint.cluster-autoscaler.kubernetes.io/csi",
                    "effect": "NoSchedule",
                },
                {
                    "key": "status-taint.cluster-autoscaler.kubernetes.io/gpu",
                    "effect": "NoSchedule",
                },
            ],
        ),
        [],
    ),
    (
        "node without status",
        mutate("status", None),
        [
            Difference(f"allocatable.{resource}", value, ABSENT, -1.0)
            for resource, value in (
                ("cpu", "4"),
                ("memory", "7580Mi"),
                ("ephemeral-storage", "45Gi"),
                ("pods", "110"),
            )
        ],
    ),
]


@pytest.mark.parametrize(("mutation", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_compare_node(mutation: Callable[[Node], None], expected: list[Difference]) -> None:
    live = live_twin()
    mutation(live)
    found = compare_node(template(), live, TOLERANCE)
    assert sorted(found, key=lambda d: d.field) == sorted(expected, key=lambda d: d.field)


@pytest.mark.parametrize(
    ("want", "have", "ratio"),
    [(100, 90, -0.1), (100, 100, 0.0), (0, 0, 0.0), (0, 5, 1.0), (4, 0, -1.0)],
)
def test_relative_difference(want: int, have: int, ratio: float) -> None:
    from fractions import Fraction

    assert relative_difference(Fraction(want), Fraction(have)) == pytest.approx(ratio)


G = "nodeGroups[2]"
ADVICE: list[tuple[Difference, str]] = [
    (
        Difference("allocatable.memory", "7580Mi", "6822Mi", -0.1),
        f"raise {G}.kubelet.systemReserved.memory by 758Mi",
    ),
    (
        Difference("allocatable.memory", "7580Mi", "7580.5Mi", 0.0001),
        f"lower {G}.kubelet reservations of memory (systemReserved, kubeReserved, evictionHard) "
        "by 1Mi",
    ),
    (
        Difference("allocatable.cpu", "4", "3900m", -0.025),
        f"raise {G}.kubelet.systemReserved.cpu by 100m",
    ),
    (
        Difference("allocatable.ephemeral-storage", "45Gi", "40Gi", -1 / 9),
        f"raise {G}.kubelet.systemReserved.ephemeral-storage by 5Gi (or set {G}.volumeSizeGB "
        "to the servers' root volume size)",
    ),
    (
        Difference("allocatable.ephemeral-storage", "45Gi", "95Gi", 10 / 9),
        f"lower {G}.kubelet reservations of ephemeral-storage (systemReserved, kubeReserved, "
        f"evictionHard) by 50Gi (or set {G}.volumeSizeGB to the servers' root volume size)",
    ),
    (
        Difference("allocatable.pods", "110", "250", 1.27),
        f"set {G}.kubelet.maxPods to 250 (what the kubelet runs with)",
    ),
    (
        Difference("allocatable.nvidia.com/gpu", "1", ABSENT, -1.0),
        "run the NVIDIA device plugin on the group's nodes (they report no GPU)",
    ),
    (
        Difference('labels["role"]', "worker", ABSENT),
        f'add the label to {G}.labels["role"] if missing, and pass ${{node_labels}} to the '
        f"kubelet's --node-labels in {G}.userData",
    ),
    (
        Difference('labels["role"]', "worker", "batch"),
        f'the nodes say "batch": set {G}.labels["role"] to it, or fix the kubelet\'s --node-labels',
    ),
    (
        Difference('labels["node.kubernetes.io/instance-type"]', "flex-8-4", "flex-16-4"),
        f"the nodes run flavor flex-16-4: set {G}.flavor to flex-16-4",
    ),
    (
        Difference('labels["topology.kubernetes.io/zone"]', "lpg1", ABSENT),
        "the cloud controller manager sets this label: check that it runs",
    ),
    (
        Difference('labels["topology.kubernetes.io/zone"]', "lpg1", "rma1"),
        f"the nodes are in rma1: set {G}.zone to match",
    ),
    (
        Difference('taints["dedicated:NoSchedule"]', "batch", ABSENT),
        f"pass ${{node_taints}} to the kubelet's --register-with-taints in {G}.userData",
    ),
    (
        Difference('taints["gpu:NoExecute"]', ABSENT, "x"),
        f"add {{key: gpu, value: 'x', effect: NoExecute}} to {G}.taints, or stop the nodes from "
        "registering with it",
    ),
]


@pytest.mark.parametrize(("difference", "advice"), ADVICE, ids=[a[0].field for a in ADVICE])
def test_advice_names_the_config_key(difference: Difference, advice: str) -> None:
    assert advise(difference, GROUP, 2) == advice


def test_summarize_keeps_the_worst_node_per_field_and_counts_nodes() -> None:
    short = Difference("allocatable.memory", "7580Mi", "7000Mi", -0.0765)
    shorter = Difference("allocatable.memory", "7580Mi", "6000Mi", -0.208)
    label = Difference('labels["role"]', "worker", ABSENT)
    drifts = summarize(GROUP, 0, [("b", [short]), ("a", [shorter, label]), ("c", [])])
    by_field = {d.field: d for d in drifts}
    memory = by_field["allocatable.memory"]
    assert (memory.node, memory.difference, memory.nodes_differing, memory.nodes_compared) == (
        "a",
        shorter,
        2,
        3,
    )
    assert memory.advice == "raise nodeGroups[0].kubelet.systemReserved.memory by 1580Mi"
    assert by_field['labels["role"]'].nodes_differing == 1
    line = warning_line(memory)
    assert line == (
        "template drift in node group workers, allocatable.memory: template 7580Mi, node a "
        "reports 6000Mi (-20.8%); 2 of 3 nodes differ; raise nodeGroups[0].kubelet."
        "systemReserved.memory by 1580Mi"
    )


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        ("allocatable.cpu", "resources"),
        ('labels["a"]', "labels"),
        ('taints["k:NoSchedule"]', "taints"),
    ],
)
def test_kind_of(field: str, kind: str) -> None:
    assert kind_of(field) == kind


def test_format_ratio() -> None:
    assert (format_ratio(-0.1234), format_ratio(None), format_ratio(0.5)) == (
        "-12.3%",
        "",
        "+50.0%",
    )


def test_gpu_template_expects_the_device_plugin() -> None:
    gpu = Flavor(slug="gpu", name="GPU", vcpu_count=8, memory_gb=32, gpu=Gpu(count=1, name="L40S"))
    group = NodeGroupConfig(name="gpu", min_size=0, max_size=1, flavor="gpu", image="x")
    promised = node_to_dict(build_template_node("prod", group, gpu, "cloudscale.ch/gpu"))
    live = copy.deepcopy(promised)
    for field in ("capacity", "allocatable"):
        del live["status"][field]["nvidia.com/gpu"]
    fields = {d.field for d in compare_node(promised, live, TOLERANCE)}
    assert fields == {"allocatable.nvidia.com/gpu"}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda n: None, True),
        (mutate("status.conditions", [{"type": "Ready", "status": "False"}]), False),
        (mutate("status.conditions", []), False),
        (mutate("spec.taints", [{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                                  "value": "true", "effect": "NoSchedule"}]), False),
    ],
    ids=["ready", "not ready", "no conditions", "uninitialized"],
)  # fmt: skip
def test_only_settled_nodes_are_compared(change: Callable[[Node], None], expected: bool) -> None:
    node = live_twin()
    change(node)
    assert settled(node) is expected


def test_capacity_is_informational_only() -> None:
    assert [informational(f) for f in ("capacity.memory", "allocatable.memory", 'labels["a"]')] == [
        True,
        False,
        False,
    ]


def _report(problem: str | None, drifts: int) -> DriftReport:
    drift = GroupDrift("a", "allocatable.cpu", "n", Difference("allocatable.cpu", "4", "2", -0.5),
                       1, 1, "raise")  # fmt: skip
    return DriftReport(
        [GroupReport("a", 1, drifts=[drift] * drifts), GroupReport("b", 1, problem=problem)]
    )


@pytest.mark.parametrize(
    ("problem", "drifts", "code", "summary"),
    [
        (None, 0, 0, "No drift"),
        (None, 1, 1, "What to change"),
        ("no template: unknown flavor", 0, 2, "Error: node group(s) b not compared"),
        ("no template: unknown flavor", 1, 2, "Error: node group(s) b not compared"),
    ],
)
def test_a_group_not_compared_is_an_error(
    problem: str | None, drifts: int, code: int, summary: str
) -> None:
    report = _report(problem, drifts)
    assert exit_code(report) == code
    out = render(report)
    assert summary in out
    assert ("No drift" in out) is (code == 0)
