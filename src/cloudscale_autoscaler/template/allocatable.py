"""Kubelet arithmetic: a flavor's capacity and what the kubelet leaves allocatable.

allocatable = capacity - systemReserved - kubeReserved - hard eviction threshold, per resource,
clamped at 0 (kubelet's nodestatus.MachineInfo with GetNodeAllocatableReservation).

Assumptions, documented because the cloud API does not settle them:
- A flavor's `memory_gb` and a volume's size in GB are GiB (2^30 bytes). cloudscale.ch does not
  say whether "GB" means 10^9 or 2^30; GiB matches how the flavors are sized (flex-16-4 is
  "16 GB") and the round numbers operators expect ("16 GiB" -> 16Gi). A real node reports a
  little less memory than this (the kernel keeps some), so the template is slightly optimistic
  on memory; systemReserved is the knob to compensate.
- The whole root volume counts as the kubelet's nodefs (ephemeral-storage capacity); real file
  systems lose a few percent to metadata.

Kubelet semantics reproduced:
- Only reservations for resources the node has are subtracted (kubelet loops over capacity).
- Eviction: memory.available reserves memory, nodefs.available reserves ephemeral-storage; no
  other signal affects allocatable. evictionHard=None means kubelet's defaults
  (memory.available 100Mi, nodefs.available 10%, nodefs.inodesFree 5%, imagefs.available 15%);
  an explicit evictionHard REPLACES the defaults (kubelet without mergeDefaultEvictionSettings).
- The exact strings "0%" and "100%" disable a threshold (kubelet ignores them).
- A percentage threshold reserves that share of capacity truncated to a whole unit, like
  kubelet's int64 conversion. We compute the share exactly; kubelet multiplies by a float32
  fraction and so may reserve a handful of bytes more (160 bytes for 10% of 100Gi). Exact
  arithmetic keeps the strings canonical ("91904Mi" rather than "96368328544"); the
  difference is far below anything a scheduler could notice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING

from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.template.quantity import (
    QuantityFormat,
    format_quantity,
    parse_percent,
    parse_quantity,
)

if TYPE_CHECKING:
    # Annotations only: at run time template/ needs nothing of the config package, which
    # imports template/ to check labels and quantities.
    from cloudscale_autoscaler.settings.types import KubeletConfig

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
NVIDIA_GPU = "nvidia.com/gpu"

GIB = 2**30

# The formats the kubelet (cadvisor / device manager) creates these quantities with; Sub keeps
# the left operand's format, so allocatable prints like capacity.
FORMATS: dict[str, QuantityFormat] = {
    CPU: "DecimalSI",
    MEMORY: "BinarySI",
    EPHEMERAL_STORAGE: "BinarySI",
    PODS: "DecimalSI",
    NVIDIA_GPU: "DecimalSI",
}

DEFAULT_EVICTION_HARD: tuple[tuple[str, str], ...] = (
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
)

# Eviction signals that reserve part of a resource in allocatable.
_SIGNAL_RESOURCE = {"memory.available": MEMORY, "nodefs.available": EPHEMERAL_STORAGE}
_DISABLED_THRESHOLDS = ("0%", "100%")


def _gib_to_bytes(amount: float | int) -> int:
    # repr() keeps the decimal the API sent (0.5, not the binary float 0.5000...01).
    return int(Fraction(repr(amount)) * GIB)


def node_capacity(flavor: Flavor, volume_size_gb: int, max_pods: int) -> dict[str, Fraction]:
    """What the kubelet would report as status.capacity on a server of this flavor."""
    capacity = {
        CPU: Fraction(flavor.vcpu_count),
        MEMORY: Fraction(_gib_to_bytes(flavor.memory_gb)),
        EPHEMERAL_STORAGE: Fraction(_gib_to_bytes(volume_size_gb)),
        PODS: Fraction(max_pods),
    }
    if flavor.gpu is not None and flavor.gpu.count > 0:
        capacity[NVIDIA_GPU] = Fraction(flavor.gpu.count)
    return capacity


def threshold_amount(signal: str, value: str, capacity: Fraction) -> Fraction:
    """How much of `capacity` one hard eviction threshold keeps back (0 if disabled)."""
    if value in _DISABLED_THRESHOLDS:
        return Fraction(0)
    if value.endswith("%"):
        try:
            percent = parse_percent(value)
        except ValueError:
            percent = None
        if percent is None or percent > 100:
            raise ValueError(
                f'evictionHard {signal}: invalid percentage "{value}": '
                "expected a number from 0 to 100 followed by %, such as 10%"
            )
        return Fraction(int(capacity * percent / 100))
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        raise ValueError(f"evictionHard {signal}: {exc} or a percentage such as 10%") from None
    if amount < 0:
        raise ValueError(f'evictionHard {signal}: threshold "{value}" must not be negative')
    return amount


def eviction_reservation(
    capacity: Mapping[str, Fraction], eviction_hard: Iterable[tuple[str, str]] | None
) -> dict[str, Fraction]:
    """Per resource, what the hard eviction thresholds keep back (kubelet defaults if None)."""
    thresholds = DEFAULT_EVICTION_HARD if eviction_hard is None else eviction_hard
    reserved: dict[str, Fraction] = {}
    for signal, value in thresholds:
        resource = _SIGNAL_RESOURCE.get(signal)
        if resource is None or resource not in capacity:
            continue  # inode/image/pid signals do not shrink allocatable
        reserved[resource] = threshold_amount(signal, value, capacity[resource])
    return reserved


def _reserved_quantities(field: str, entries: Iterable[tuple[str, str]]) -> dict[str, Fraction]:
    reserved: dict[str, Fraction] = {}
    for resource, value in entries:
        try:
            reserved[resource] = reserved.get(resource, Fraction(0)) + parse_quantity(value)
        except ValueError as exc:
            raise ValueError(f"{field} {resource}: {exc}") from None
    return reserved


def node_reservation(
    capacity: Mapping[str, Fraction], kubelet: KubeletConfig
) -> dict[str, Fraction]:
    """systemReserved + kubeReserved + hard eviction, for each resource the node has."""
    parts = (
        _reserved_quantities("systemReserved", kubelet.system_reserved),
        _reserved_quantities("kubeReserved", kubelet.kube_reserved),
        eviction_reservation(capacity, kubelet.eviction_hard),
    )
    return {
        resource: sum((part.get(resource, Fraction(0)) for part in parts), Fraction(0))
        for resource in capacity
    }


def node_allocatable(
    capacity: Mapping[str, Fraction], kubelet: KubeletConfig
) -> dict[str, Fraction]:
    """status.allocatable: capacity minus reservations, never below zero."""
    reservation = node_reservation(capacity, kubelet)
    return {
        resource: max(Fraction(0), amount - reservation[resource])
        for resource, amount in capacity.items()
    }


def quantity_strings(values: Mapping[str, Fraction]) -> dict[str, str]:
    """Canonical Kubernetes strings, each in the format the kubelet uses for that resource."""
    return {
        resource: format_quantity(amount, FORMATS.get(resource, "DecimalSI"))
        for resource, amount in sorted(values.items())
    }
