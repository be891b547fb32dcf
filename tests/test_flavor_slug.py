"""Flavor sizes read from the slug (the fallback when the flavor list cannot be fetched)."""

from __future__ import annotations

import pytest

from cloudscale_autoscaler.cloud.emulator.catalogue import FLAVORS
from cloudscale_autoscaler.template.slug import flavor_from_slug


@pytest.mark.parametrize(
    ("slug", "vcpus", "memory_gb", "gpus"),
    [
        ("flex-4-1", 1, 4, 0),
        ("flex-8-4", 4, 8, 0),
        ("plus-32-16", 16, 32, 0),
        ("plus-192-96", 96, 192, 0),
        ("gpu2-128-16-1-200", 16, 128, 1),
        ("gpu2-256-32-2-400", 32, 256, 2),
        ("gpu1-64-8-1-100", 8, 64, 1),
    ],
)
def test_known_patterns(slug: str, vcpus: int, memory_gb: int, gpus: int) -> None:
    flavor = flavor_from_slug(slug)
    assert flavor is not None
    assert (flavor.slug, flavor.vcpu_count, flavor.memory_gb) == (slug, vcpus, memory_gb)
    assert (flavor.gpu.count if flavor.gpu else 0) == gpus
    # The model is not in the slug: the GPU label value becomes "unknown".
    assert flavor.gpu is None or flavor.gpu.name == ""


@pytest.mark.parametrize(
    "slug",
    [
        "",
        "flex",
        "flex-8",
        "flex-8-4-1",
        "flex-0-4",
        "flex-08-4",
        "FLEX-8-4",
        "mega-8-4",
        "gpu2-128-16",
        "gpu2-128-16-1",
        "custom-large",
        "flex-8-4 ",
        "flex-٨-4",  # a non-ASCII digit
    ],
)
def test_unknown_patterns(slug: str) -> None:
    assert flavor_from_slug(slug) is None


def test_every_catalogue_flavor_parses_to_its_listed_size() -> None:
    for spec in FLAVORS.values():
        flavor = flavor_from_slug(spec.slug)
        assert flavor is not None, spec.slug
        assert (flavor.vcpu_count, flavor.memory_gb) == (spec.vcpu_count, spec.memory_gb)
        assert (flavor.gpu.count if flavor.gpu else 0) == (spec.gpu.count if spec.gpu else 0)
