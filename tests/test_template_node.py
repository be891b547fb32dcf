"""The template Node: labels, taints, resources, and its bytes read back by an independent decoder.

The decoder below is deliberately written from the protobuf wire format and the field numbers of
k8s.io/api core/v1 (its generated.proto), not from our generated classes, so a
wrong field number or a wrong nesting in our .proto would show up here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from cloudscale_autoscaler.cloud.models import Flavor, Gpu
from cloudscale_autoscaler.settings.types import KubeletConfig, NodeGroupConfig, Taint
from cloudscale_autoscaler.template.labels import gpu_label_value, region_of
from cloudscale_autoscaler.template.node import (
    build_template_node,
    template_labels,
    template_node_bytes,
)

GPU_LABEL = "cloudscale.ch/gpu"
FLEX = Flavor(slug="flex-16-8", name="Flex-16-8", vcpu_count=8, memory_gb=16)
GPU_FLAVOR = Flavor(
    slug="gpu2-128-16-1-200",
    name="GPU2-128-16-1-200",
    vcpu_count=16,
    memory_gb=128,
    gpu=Gpu(count=2, name="NVIDIA RTX PRO 6000 Max-Q", vram_per_gpu_gb=96),
)
WORKERS = NodeGroupConfig(
    name="workers",
    min_size=0,
    max_size=10,
    flavor="flex-16-8",
    image="debian-12",
    zone="lpg1",
    volume_size_gb=100,
    labels=(("role", "worker"), ("team", "infra")),
    taints=(
        Taint(key="dedicated", value="batch", effect="NoSchedule"),
        Taint(key="spot", value="", effect="PreferNoSchedule"),
    ),
    kubelet=KubeletConfig(
        system_reserved=(("cpu", "50m"), ("memory", "384Mi"), ("ephemeral-storage", "256Mi")),
        eviction_hard=(("memory.available", "100Mi"), ("nodefs.available", "10%")),
    ),
)


# --- a tiny protobuf wire-format decoder ------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def wire_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) in wire order; varints as int, length-delimited as bytes."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = _varint(buf, pos)
            out.append((number, value))
        elif wire_type == 2:
            length, pos = _varint(buf, pos)
            out.append((number, buf[pos : pos + length]))
            pos += length
        elif wire_type in (1, 5):  # fixed64 / fixed32: not used by Node, kept for robustness
            size = 8 if wire_type == 1 else 4
            out.append((number, buf[pos : pos + size]))
            pos += size
        else:
            raise AssertionError(f"unexpected wire type {wire_type} for field {number}")
    assert pos == len(buf), "message overran its length"
    return out


def _bytes_of(value: int | bytes) -> bytes:
    assert isinstance(value, bytes), f"expected a length-delimited field, got {value!r}"
    return value


def _text(value: int | bytes) -> str:
    return _bytes_of(value).decode()


def _sub(buf: bytes, number: int) -> list[bytes]:
    return [_bytes_of(v) for n, v in wire_fields(buf) if n == number]


def _one(buf: bytes, number: int) -> bytes:
    found = _sub(buf, number)
    assert len(found) == 1, f"field {number} appears {len(found)} times"
    return found[0]


def _string_field(buf: bytes, number: int) -> str | None:
    found = _sub(buf, number)
    return found[-1].decode() if found else None


def _map_entries(buf: bytes, number: int) -> list[tuple[str, bytes]]:
    """A proto map as (key, raw value) in wire order; entries are key=1, value=2."""
    entries = []
    for entry in _sub(buf, number):
        key = _one(entry, 1).decode()
        entries.append((key, _one(entry, 2)))
    return entries


@dataclass
class DecodedNode:
    name: str | None
    labels: list[tuple[str, str]]
    annotations: list[tuple[str, str]]
    provider_id: str | None
    taints: list[tuple[str | None, str | None, str | None]]
    capacity: list[tuple[str, str]]
    allocatable: list[tuple[str, str]]
    phase: str | None
    conditions: list[dict[int, str]] = field(default_factory=list)
    os: str | None = None
    arch: str | None = None
    spec_fields: set[int] = field(default_factory=set)


def decode_node(buf: bytes) -> DecodedNode:
    assert {n for n, _ in wire_fields(buf)} <= {1, 2, 3}
    meta, spec, status = _one(buf, 1), _one(buf, 2), _one(buf, 3)
    node_info = _one(status, 7)

    def quantities(number: int) -> list[tuple[str, str]]:
        return [(key, _one(value, 1).decode()) for key, value in _map_entries(status, number)]

    return DecodedNode(
        name=_string_field(meta, 1),
        labels=[(k, v.decode()) for k, v in _map_entries(meta, 11)],
        annotations=[(k, v.decode()) for k, v in _map_entries(meta, 12)],
        provider_id=_string_field(spec, 3),
        taints=[
            (_string_field(t, 1), _string_field(t, 2), _string_field(t, 3)) for t in _sub(spec, 5)
        ],
        capacity=quantities(1),
        allocatable=quantities(2),
        phase=_string_field(status, 3),
        conditions=[{n: _text(v) for n, v in wire_fields(c)} for c in _sub(status, 4)],
        os=_string_field(node_info, 9),
        arch=_string_field(node_info, 10),
        spec_fields={n for n, _ in wire_fields(spec)},
    )


def test_decoder_reads_a_hand_built_message() -> None:
    # Node{metadata{name:"a", labels{"k":"v"}}}: bytes written out by hand from the wire format.
    label_entry = b"\x0a\x01k\x12\x01v"
    meta = b"\x0a\x01a" + b"\x5a" + bytes([len(label_entry)]) + label_entry
    buf = b"\x0a" + bytes([len(meta)]) + meta + b"\x12\x00" + b"\x1a\x02\x3a\x00"
    decoded = decode_node(buf)
    assert decoded.name == "a"
    assert decoded.labels == [("k", "v")]


# --- the template's bytes ---------------------------------------------------------------------


def test_bytes_decode_into_the_expected_node() -> None:
    decoded = decode_node(template_node_bytes("prod", WORKERS, FLEX, GPU_LABEL))
    assert decoded.name == "template-workers"
    assert dict(decoded.labels) == {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": "template-workers",
        "node.kubernetes.io/instance-type": "flex-16-8",
        "topology.kubernetes.io/zone": "lpg1",
        "topology.kubernetes.io/region": "lpg",
        "role": "worker",
        "team": "infra",
    }
    assert dict(decoded.annotations) == {
        "autoscaler.cloudscale.ch/cluster": "prod",
        "autoscaler.cloudscale.ch/node-group": "workers",
    }
    assert decoded.provider_id is None  # left empty on purpose: see template/node.py
    assert decoded.taints == [
        ("dedicated", "batch", "NoSchedule"),
        ("spot", "", "PreferNoSchedule"),
    ]
    assert decoded.capacity == [
        ("cpu", "8"),
        ("ephemeral-storage", "100Gi"),
        ("memory", "16Gi"),
        ("pods", "110"),
    ]
    assert decoded.allocatable == [
        ("cpu", "7950m"),
        ("ephemeral-storage", "91904Mi"),
        ("memory", "15900Mi"),
        ("pods", "110"),
    ]
    assert decoded.phase == "Running"
    assert decoded.conditions[0] == {
        1: "Ready",
        2: "True",
        5: "KubeletReady",
        6: "kubelet is posting ready status",
    }
    assert [(c[1], c[2]) for c in decoded.conditions[1:]] == [
        ("MemoryPressure", "False"),
        ("DiskPressure", "False"),
        ("PIDPressure", "False"),
    ]
    assert (decoded.os, decoded.arch) == ("linux", "amd64")


def test_gpu_template_bytes() -> None:
    group = replace(WORKERS, name="gpu", flavor=GPU_FLAVOR.slug, labels=(), taints=())
    decoded = decode_node(template_node_bytes("prod", group, GPU_FLAVOR, GPU_LABEL))
    assert dict(decoded.labels)[GPU_LABEL] == "nvidia-rtx-pro-6000-max-q"
    assert ("nvidia.com/gpu", "2") in decoded.capacity
    assert ("nvidia.com/gpu", "2") in decoded.allocatable
    assert decoded.taints == []


def test_no_timestamps_anywhere() -> None:
    decoded = decode_node(template_node_bytes("prod", WORKERS, FLEX, GPU_LABEL))
    # Condition fields 3/4 are lastHeartbeatTime/lastTransitionTime; taint field 4 is timeAdded.
    assert all(set(c) == {1, 2, 5, 6} for c in decoded.conditions)
    assert decoded.spec_fields == {5}  # only taints: no providerID, podCIDR, unschedulable


def test_bytes_are_deterministic() -> None:
    first = template_node_bytes("prod", WORKERS, FLEX, GPU_LABEL)
    assert template_node_bytes("prod", WORKERS, FLEX, GPU_LABEL) == first
    # The same labels configured in another order give the same bytes (maps are sorted).
    shuffled = replace(WORKERS, labels=tuple(reversed(WORKERS.labels)))
    assert template_node_bytes("prod", shuffled, FLEX, GPU_LABEL) == first


def _go_order(keys: list[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode())  # Go sorts map keys as byte strings


@pytest.mark.parametrize("flavor", [FLEX, GPU_FLAVOR], ids=["flex", "gpu"])
def test_map_entries_are_sorted_like_go(flavor: Flavor) -> None:
    group = replace(
        WORKERS,
        labels=(("zz", "1"), ("Upper", "2"), ("a.b/c", "3"), ("a-b", "4"), ("a_b", "5")),
    )
    decoded = decode_node(template_node_bytes("prod", group, flavor, GPU_LABEL))
    for entries in (decoded.labels, decoded.annotations, decoded.capacity, decoded.allocatable):
        keys = [key for key, _ in entries]
        assert keys == _go_order(keys)
        assert len(keys) == len(set(keys))


def test_message_equals_its_bytes() -> None:
    node = build_template_node("prod", WORKERS, FLEX, GPU_LABEL)
    assert node.SerializeToString(deterministic=True) == template_node_bytes(
        "prod", WORKERS, FLEX, GPU_LABEL
    )


# --- labels -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "group_labels", "flavor", "expected"),
    [
        pytest.param(
            "lpg1",
            (),
            FLEX,
            {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "flex-16-8",
                "topology.kubernetes.io/zone": "lpg1",
                "topology.kubernetes.io/region": "lpg",
                "kubernetes.io/hostname": "template-g",
            },
            id="zone-gives-zone-and-region",
        ),
        pytest.param(
            None,
            (),
            FLEX,
            {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "flex-16-8",
                "kubernetes.io/hostname": "template-g",
            },
            id="no-zone-no-topology-labels",
        ),
        pytest.param(
            "rma1",
            (("topology.kubernetes.io/zone", "custom"), ("kubernetes.io/arch", "arm64")),
            FLEX,
            {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "flex-16-8",
                "topology.kubernetes.io/zone": "rma1",
                "topology.kubernetes.io/region": "rma",
                "kubernetes.io/hostname": "template-g",
            },
            # The config refuses such labels; the template says what the nodes will carry.
            id="computed-keys-keep-what-kubelet-and-ccm-write",
        ),
        pytest.param(
            "lpg1",
            ((GPU_LABEL, "my-own-name"), ("role", "gpu")),
            GPU_FLAVOR,
            {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "gpu2-128-16-1-200",
                "topology.kubernetes.io/zone": "lpg1",
                "topology.kubernetes.io/region": "lpg",
                "kubernetes.io/hostname": "template-g",
                GPU_LABEL: "my-own-name",
                "role": "gpu",
            },
            id="group-labels-override-the-gpu-label",
        ),
        pytest.param(
            "lpg1",
            (),
            GPU_FLAVOR,
            {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "gpu2-128-16-1-200",
                "topology.kubernetes.io/zone": "lpg1",
                "topology.kubernetes.io/region": "lpg",
                "kubernetes.io/hostname": "template-g",
                GPU_LABEL: "nvidia-rtx-pro-6000-max-q",
            },
            id="gpu-flavor-gets-the-gpu-label",
        ),
    ],
)
def test_template_labels(
    zone: str | None,
    group_labels: tuple[tuple[str, str], ...],
    flavor: Flavor,
    expected: dict[str, str],
) -> None:
    group = replace(WORKERS, name="g", zone=zone, labels=group_labels)
    labels = template_labels(group, flavor, GPU_LABEL)
    assert labels == expected
    # Computed labels first, in a fixed order, then the group's: stable for humans and diffs.
    assert list(labels)[:3] == [
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "node.kubernetes.io/instance-type",
    ]


def test_custom_gpu_label_key() -> None:
    group = replace(WORKERS, labels=())
    labels = template_labels(group, GPU_FLAVOR, "example.com/accelerator")
    assert labels["example.com/accelerator"] == "nvidia-rtx-pro-6000-max-q"
    assert GPU_LABEL not in labels


@pytest.mark.parametrize(
    ("zone", "region"),
    [("lpg1", "lpg"), ("rma1", "rma"), ("abc12", "abc"), ("zone", "zone"), ("123", "123")],
)
def test_region_of(zone: str, region: str) -> None:
    assert region_of(zone) == region


@pytest.mark.parametrize(
    ("model", "value"),
    [
        ("NVIDIA RTX PRO 6000 Max-Q", "nvidia-rtx-pro-6000-max-q"),
        ("NVIDIA L40S", "nvidia-l40s"),
        ("Tesla T4", "tesla-t4"),
        ("NVIDIA A100 80GB PCIe", "nvidia-a100-80gb-pcie"),
        ("  GeForce RTX 4090 (24 GB)  ", "geforce-rtx-4090-24-gb"),
        ("H100_SXM5.80GB", "h100-sxm5-80gb"),
        ("Ünïcode GPU", "n-code-gpu"),
        ("---", "unknown"),
        ("", "unknown"),
        ("x" * 70, "x" * 63),
        ("a" * 62 + " b", "a" * 62),  # cut at 63 would end in "-": trimmed
    ],
)
def test_gpu_label_value(model: str, value: str) -> None:
    result = gpu_label_value(model)
    assert result == value
    assert len(result) <= 63


def test_taints_come_from_config_in_order() -> None:
    node = build_template_node("prod", WORKERS, FLEX, GPU_LABEL)
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [
        ("dedicated", "batch", "NoSchedule"),
        ("spot", "", "PreferNoSchedule"),
    ]
    untainted = build_template_node("prod", replace(WORKERS, taints=()), FLEX, GPU_LABEL)
    assert len(untainted.spec.taints) == 0
