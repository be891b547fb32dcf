"""A flavor from its slug alone, for when the API's flavor list cannot be fetched (pure).

cloudscale.ch flavor slugs encode their size: `flex-<memory GB>-<vCPUs>` (shared vCPUs),
`plus-<memory GB>-<vCPUs>` (dedicated vCPUs) and `gpu<generation>-<memory GB>-<vCPUs>-<GPUs>-
<n>` (for example gpu2-128-16-1-200: 128 GB, 16 vCPUs, 1 GPU). The API's flavor list confirms
the first three numbers of every slug it lists; what the last number of a GPU slug counts is
not published, and it is not used. The GPU model is not in the slug: it comes out as "" (the
GPU label value "unknown") until the flavor list can be read again.
"""

from __future__ import annotations

import re

from cloudscale_autoscaler.cloud.models import Flavor, Gpu

_CPU_SLUG = re.compile(r"(flex|plus)-([1-9][0-9]*)-([1-9][0-9]*)")
_GPU_SLUG = re.compile(r"gpu[0-9]*-([1-9][0-9]*)-([1-9][0-9]*)-([0-9]+)-([0-9]+)")


def flavor_from_slug(slug: str) -> Flavor | None:
    """The flavor the slug describes, or None when the slug follows no known pattern."""
    match = _CPU_SLUG.fullmatch(slug)
    if match is not None:
        return Flavor(slug, slug, vcpu_count=int(match[3]), memory_gb=int(match[2]))
    match = _GPU_SLUG.fullmatch(slug)
    if match is not None:
        gpus = int(match[3])
        gpu = Gpu(count=gpus, name="") if gpus else None
        return Flavor(slug, slug, vcpu_count=int(match[2]), memory_gb=int(match[1]), gpu=gpu)
    return None
