"""Conformance of the pricing RPCs with `pricing` configured: what each CA generation's client
returns for a template node, a node of another provider and CA's stabilization pod. (Without
`pricing`, the main scenario in test_conformance.py asserts ErrNotImplemented for both.)

The expected prices are computed here from the configured numbers with exact fractions, as
docs/configuration.md describes the model; the server must answer exactly their float.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from test_conformance import (
    BUILD_TIMEOUT,
    GROUPS,
    HARNESS_TIMEOUT,
    RELEASES,
    GroupSpec,
    Processes,
    go_build,
    harness_binaries,  # noqa: F401  (the fixture, shared with the main scenario's module)
    processes,  # noqa: F401
    run_harness,
    start_stack,
)

pytestmark = pytest.mark.conformance

FLAVOR_PRICES = {"flex-8-4": "0.0913", "gpu2-128-16-1-200": "2.4321"}
VOLUME_PRICE = "0.000125"
VOLUME_GB = 10  # the groups leave volumeSizeGB at its default
PRICING = {"currency": "CHF", "flavorsPerHour": FLAVOR_PRICES, "volumePerGBHour": VOLUME_PRICE}
MI = 2**20
GI = 2**30
# What GroupSpec.config() reserves for memory (system + kube reserved, eviction threshold).
MEMORY_RESERVED = (512 + 256 + 100) * MI


def hourly(spec: GroupSpec) -> Fraction:
    return Fraction(FLAVOR_PRICES[spec.flavor]) + Fraction(VOLUME_PRICE) * VOLUME_GB


def stabilization_pod_price() -> Fraction:
    """CA's 500m/500Mi pod on the group where its dominant share costs least."""
    prices = []
    for spec in GROUPS:
        memory_gib = int(spec.flavor.split("-")[1])
        cpu = Fraction(spec.vcpus * 1000 - spec.cpu_reserved_milli, 1000)
        memory = Fraction(memory_gib * GI - MEMORY_RESERVED)
        share = max(Fraction(1, 2) / cpu, Fraction(500 * MI) / memory, Fraction(1, spec.max_pods))
        prices.append(hourly(spec) * share)
    return min(prices)


def expected_prices() -> dict[str, Any]:
    return {
        "nodePrices": {spec.name: float(hourly(spec)) for spec in GROUPS},
        "podPrice": float(stabilization_pod_price()),
    }


@pytest.mark.timeout(BUILD_TIMEOUT + HARNESS_TIMEOUT + 120)
@pytest.mark.parametrize("release", RELEASES)
def test_ca_client_reads_prices(
    release: str,
    tmp_path: Path,
    processes: Processes,  # noqa: F811
    harness_binaries: dict[str, Path],  # noqa: F811
) -> None:
    if release not in harness_binaries:
        harness_binaries[release] = go_build(release)
    stack = start_stack(tmp_path, processes, pricing=PRICING)
    expect = tmp_path / "expect.json"
    expect.write_text(
        json.dumps(
            {
                "cluster": "conformance",
                "scaleGroup": GROUPS[0].name,
                "groups": [{"id": spec.name} for spec in GROUPS],
                "pricing": expected_prices(),
            }
        )
    )
    binary = harness_binaries[release]
    output = run_harness(
        release, binary, tmp_path, stack, expect, processes, "-scenario", "pricing"
    )
    assert "Pricing.PodPrice" in output and "Pricing.NodePrice[unknown node]" in output
