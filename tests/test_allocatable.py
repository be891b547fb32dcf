"""Kubelet arithmetic: capacity - systemReserved - kubeReserved - hard eviction, clamped at 0."""

from __future__ import annotations

from fractions import Fraction

import pytest

from cloudscale_autoscaler.cloud.models import Flavor, Gpu
from cloudscale_autoscaler.settings.types import KubeletConfig
from cloudscale_autoscaler.template.allocatable import (
    eviction_reservation,
    node_allocatable,
    node_capacity,
    quantity_strings,
)

Mi, Gi = 2**20, 2**30

FLEX_16_8 = Flavor(slug="flex-16-8", name="Flex-16-8", vcpu_count=8, memory_gb=16)
GPU_FLAVOR = Flavor(
    slug="gpu2-128-16-1-200",
    name="GPU2-128-16-1-200",
    vcpu_count=16,
    memory_gb=128,
    gpu=Gpu(count=1, name="NVIDIA RTX PRO 6000 Max-Q", vram_per_gpu_gb=96),
)
ACCEPTANCE_KUBELET = KubeletConfig(
    system_reserved=(("cpu", "50m"), ("memory", "384Mi"), ("ephemeral-storage", "256Mi")),
    eviction_hard=(("memory.available", "100Mi"), ("nodefs.available", "10%")),
)


def allocatable_for(
    kubelet: KubeletConfig, flavor: Flavor = FLEX_16_8, volume_gb: int = 100
) -> dict[str, Fraction]:
    return node_allocatable(node_capacity(flavor, volume_gb, kubelet.max_pods), kubelet)


def test_acceptance_example_values() -> None:
    allocatable = allocatable_for(ACCEPTANCE_KUBELET)
    assert allocatable == {
        "cpu": Fraction(7950, 1000),
        "memory": Fraction(16 * Gi - 384 * Mi - 100 * Mi),
        "ephemeral-storage": Fraction(100 * Gi - 256 * Mi - 10 * Gi),
        "pods": Fraction(110),
    }


def test_acceptance_example_strings() -> None:
    assert quantity_strings(allocatable_for(ACCEPTANCE_KUBELET)) == {
        "cpu": "7950m",
        "ephemeral-storage": "91904Mi",  # 100Gi - 256Mi - 10Gi
        "memory": "15900Mi",
        "pods": "110",
    }


def test_capacity_of_a_flavor() -> None:
    capacity = node_capacity(FLEX_16_8, 100, 110)
    assert quantity_strings(capacity) == {
        "cpu": "8",
        "ephemeral-storage": "100Gi",
        "memory": "16Gi",
        "pods": "110",
    }


def test_gpu_flavor_has_gpu_capacity_and_allocatable() -> None:
    kubelet = KubeletConfig(system_reserved=(("nvidia.com/gpu", "1"),))  # not reservable
    capacity = node_capacity(GPU_FLAVOR, 200, 110)
    assert capacity["nvidia.com/gpu"] == 1
    allocatable = node_allocatable(capacity, KubeletConfig())
    assert quantity_strings(allocatable)["nvidia.com/gpu"] == "1"
    # A reservation for a resource is subtracted only if kubelet would (any capacity key).
    assert node_allocatable(capacity, kubelet)["nvidia.com/gpu"] == 0


def test_flavor_without_gpu_has_no_gpu_resource() -> None:
    assert "nvidia.com/gpu" not in node_capacity(FLEX_16_8, 10, 110)
    zero_gpus = Flavor("odd", "odd", 2, 4, gpu=Gpu(count=0, name="none"))
    assert "nvidia.com/gpu" not in node_capacity(zero_gpus, 10, 110)


@pytest.mark.parametrize(
    ("kubelet", "flavor", "volume_gb", "expected"),
    [
        pytest.param(
            KubeletConfig(),
            FLEX_16_8,
            100,
            {"cpu": "8", "memory": "16284Mi", "ephemeral-storage": "90Gi", "pods": "110"},
            id="kubelet-defaults",
        ),
        pytest.param(
            KubeletConfig(max_pods=58),
            FLEX_16_8,
            50,
            {"cpu": "8", "memory": "16284Mi", "ephemeral-storage": "45Gi", "pods": "58"},
            id="defaults-max-pods-and-small-volume",
        ),
        pytest.param(
            KubeletConfig(
                system_reserved=(("cpu", "50m"),),
                kube_reserved=(("cpu", "100m"), ("memory", "1Gi")),
            ),
            FLEX_16_8,
            100,
            {"cpu": "7850m", "memory": "15260Mi", "ephemeral-storage": "90Gi", "pods": "110"},
            id="kube-and-system-reserved-add-up",
        ),
        pytest.param(
            KubeletConfig(eviction_hard=()),
            FLEX_16_8,
            100,
            {"cpu": "8", "memory": "16Gi", "ephemeral-storage": "100Gi", "pods": "110"},
            id="explicit-empty-eviction-replaces-defaults",
        ),
        pytest.param(
            KubeletConfig(eviction_hard=(("memory.available", "500Mi"),)),
            FLEX_16_8,
            100,
            {"cpu": "8", "memory": "15884Mi", "ephemeral-storage": "100Gi", "pods": "110"},
            id="explicit-eviction-drops-default-nodefs",
        ),
        pytest.param(
            KubeletConfig(eviction_hard=(("memory.available", "5%"), ("nodefs.available", "1Gi"))),
            FLEX_16_8,
            100,
            # 5% of 16Gi is 858993459.2 bytes: truncated to a whole byte like kubelet does.
            {"cpu": "8", "memory": "16320875725", "ephemeral-storage": "99Gi", "pods": "110"},
            id="memory-percentage-truncates",
        ),
        pytest.param(
            KubeletConfig(
                eviction_hard=(("memory.available", "12.5%"), ("nodefs.available", "12.5%"))
            ),
            FLEX_16_8,
            100,
            {"cpu": "8", "memory": "14Gi", "ephemeral-storage": "89600Mi", "pods": "110"},
            id="fractional-percentages",
        ),
        pytest.param(
            KubeletConfig(
                eviction_hard=(
                    ("nodefs.inodesFree", "50%"),
                    ("imagefs.available", "50%"),
                    ("imagefs.inodesFree", "50%"),
                    ("pid.available", "50%"),
                )
            ),
            FLEX_16_8,
            100,
            {"cpu": "8", "memory": "16Gi", "ephemeral-storage": "100Gi", "pods": "110"},
            id="signals-that-do-not-touch-allocatable",
        ),
        pytest.param(
            KubeletConfig(eviction_hard=(("memory.available", "0%"), ("nodefs.available", "100%"))),
            FLEX_16_8,
            100,
            {"cpu": "8", "memory": "16Gi", "ephemeral-storage": "100Gi", "pods": "110"},
            id="zero-and-hundred-percent-disable-a-threshold",
        ),
        pytest.param(
            KubeletConfig(eviction_hard=(("nodefs.available", "99.5%"),)),
            FLEX_16_8,
            100,
            {"cpu": "8", "memory": "16Gi", "ephemeral-storage": "512Mi", "pods": "110"},
            id="large-percentage",
        ),
        pytest.param(
            KubeletConfig(
                system_reserved=(("cpu", "6"), ("memory", "8Gi")),
                kube_reserved=(("cpu", "4"), ("memory", "9Gi"), ("ephemeral-storage", "200Gi")),
            ),
            FLEX_16_8,
            100,
            {"cpu": "0", "memory": "0", "ephemeral-storage": "0", "pods": "110"},
            id="clamped-at-zero",
        ),
        pytest.param(
            KubeletConfig(system_reserved=(("memory", "1.5"), ("pid", "1000"))),
            Flavor("flex-4-1", "Flex-4-1", 1, 4),
            10,
            # 1.5 bytes reserved: kubelet keeps the exact decimal, so milli-bytes appear.
            {"cpu": "1", "memory": "4190109694500m", "ephemeral-storage": "9Gi", "pods": "110"},
            id="odd-reservations-and-ignored-pid",
        ),
        pytest.param(
            KubeletConfig(system_reserved=(("memory", "512M"),), eviction_hard=()),
            Flavor("half", "Half", 1, 0.5),
            10,
            # 0.5 GiB = 536870912 bytes; 512M = 512000000 bytes; 24870912 = 24288 * 1024.
            {"cpu": "1", "memory": "24288Ki", "ephemeral-storage": "10Gi", "pods": "110"},
            id="fractional-memory-gb-and-decimal-reservation",
        ),
        pytest.param(
            KubeletConfig(),
            GPU_FLAVOR,
            200,
            {
                "cpu": "16",
                "memory": "130972Mi",
                "ephemeral-storage": "180Gi",
                "nvidia.com/gpu": "1",
                "pods": "110",
            },
            id="gpu-flavor",
        ),
    ],
)
def test_allocatable_table(
    kubelet: KubeletConfig, flavor: Flavor, volume_gb: int, expected: dict[str, str]
) -> None:
    assert quantity_strings(allocatable_for(kubelet, flavor, volume_gb)) == expected


def test_defaults_reserve_100mi_memory_and_10_percent_of_nodefs() -> None:
    capacity = node_capacity(FLEX_16_8, 100, 110)
    assert eviction_reservation(capacity, None) == {
        "memory": Fraction(100 * Mi),
        "ephemeral-storage": Fraction(10 * Gi),
    }
    allocatable = node_allocatable(capacity, KubeletConfig())
    assert allocatable["memory"] == capacity["memory"] - 100 * Mi
    assert allocatable["ephemeral-storage"] == capacity["ephemeral-storage"] * Fraction(9, 10)


def test_pods_allocatable_is_max_pods() -> None:
    for max_pods in (1, 58, 110, 250):
        allocatable = allocatable_for(KubeletConfig(max_pods=max_pods, system_reserved=()))
        assert allocatable["pods"] == max_pods


@pytest.mark.parametrize(
    ("kubelet", "message"),
    [
        (
            KubeletConfig(system_reserved=(("memory", "lots"),)),
            'systemReserved memory: invalid quantity "lots"',
        ),
        (
            KubeletConfig(kube_reserved=(("cpu", "3.95 cores"),)),
            'kubeReserved cpu: invalid quantity "3.95 cores"',
        ),
        (
            KubeletConfig(eviction_hard=(("memory.available", "ten%"),)),
            'evictionHard memory.available: invalid percentage "ten%"',
        ),
        (
            KubeletConfig(eviction_hard=(("nodefs.available", "101%"),)),
            'evictionHard nodefs.available: invalid percentage "101%"',
        ),
        (
            KubeletConfig(eviction_hard=(("memory.available", "-1Mi"),)),
            'evictionHard memory.available: threshold "-1Mi" must not be negative',
        ),
        (
            KubeletConfig(eviction_hard=(("memory.available", "1 Mi"),)),
            'evictionHard memory.available: invalid quantity "1 Mi"',
        ),
    ],
)
def test_bad_values_name_the_field(kubelet: KubeletConfig, message: str) -> None:
    with pytest.raises(ValueError) as info:
        allocatable_for(kubelet)
    assert str(info.value).startswith(message)
