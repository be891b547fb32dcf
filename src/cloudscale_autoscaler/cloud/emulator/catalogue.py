"""The emulator's fixed catalogue: zones, flavors, images, networks and the server groups it
starts with.

Flavor sizes come from the slug (flex-<mem>-<vcpu>, plus-<mem>-<vcpu>,
gpu2-<mem>-<vcpu>-<gpus>-<disk>) so the numbers can never disagree with the names. Which flavor
or image exists in which zone is the emulator's choice (see docs/emulator.md): the GPU flavors
and the ubuntu-20.04 image exist in one zone only, so zone-availability checks are testable.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

ZONES: tuple[str, ...] = ("rma1", "lpg1")
REGIONS: dict[str, tuple[str, ...]] = {"rma": ("rma1",), "lpg": ("lpg1",)}
# A create request without "zone" lands here (the project's default zone in the real API).
DEFAULT_ZONE = "rma1"
MIN_VOLUME_SIZE_GB = 10
MAX_SERVERS_PER_GROUP = 4
STATUSES: frozenset[str] = frozenset(
    {
        "changing",
        "running",
        "stopped",
        "paused",
        "rescue_running",
        "rescue_stopped",
        "error",
        "unknown",
    }
)

# Fixed namespace, so derived ids (volumes, subnets, networks) are stable across runs.
_NAMESPACE = uuid.UUID("6b1f8f5e-3c1d-4c58-9a4e-2f0d6f1c9a10")


def derived_uuid(*parts: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, "/".join(parts)))


def href(base: str, collection: str, ident: str) -> str:
    """Absolute like the real API's hrefs; `base` is the emulator's ".../v1" URL."""
    return f"{base}/{collection}/{ident}"


def zone_stubs(zones: tuple[str, ...]) -> list[dict[str, str]]:
    return [{"slug": zone} for zone in zones]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    count: int
    name: str
    vram_per_gpu_gb: int

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "name": self.name,
            "vram_per_gpu_gb": self.vram_per_gpu_gb,
            "total_vram_gb": self.count * self.vram_per_gpu_gb,
        }


@dataclass(frozen=True, slots=True)
class FlavorSpec:
    slug: str
    name: str
    vcpu_count: int
    memory_gb: int
    zones: tuple[str, ...]
    gpu: GpuSpec | None = None

    def stub(self) -> dict[str, Any]:
        """The flavor as embedded in a server object."""
        return {
            "slug": self.slug,
            "name": self.name,
            "vcpu_count": self.vcpu_count,
            "memory_gb": self.memory_gb,
        }

    def to_json(self) -> dict[str, Any]:
        gpu = self.gpu.to_json() if self.gpu else None
        return {**self.stub(), "gpu": gpu, "zones": zone_stubs(self.zones)}


def flavor_from_slug(
    slug: str, zones: tuple[str, ...] = ZONES, gpu_model: GpuSpec | None = None
) -> FlavorSpec:
    """Parse memory/vCPU (and the GPU count, for gpu* slugs with a `gpu_model`) out of a
    slug; the only source of the numbers."""
    family, *numbers = slug.split("-")
    memory_gb, vcpu_count = int(numbers[0]), int(numbers[1])
    gpu = replace(gpu_model, count=int(numbers[2])) if gpu_model else None
    name = slug.upper() if gpu else f"{family.capitalize()}-{'-'.join(numbers)}"
    return FlavorSpec(slug, name, vcpu_count, memory_gb, zones, gpu)


_RTX_PRO_6000 = GpuSpec(count=1, name="NVIDIA RTX PRO 6000 Max-Q", vram_per_gpu_gb=96)
_GPU_ZONES = ("rma1",)

FLAVORS: dict[str, FlavorSpec] = {
    flavor.slug: flavor
    for flavor in [
        *(
            flavor_from_slug(slug)
            for slug in (
                "flex-4-1",
                "flex-4-2",
                "flex-4-4",
                "flex-8-2",
                "flex-8-4",
                "flex-16-4",
                "flex-16-8",
                "flex-32-8",
                "flex-48-12",
                "flex-64-16",
                "flex-96-24",
                "plus-8-2",
                "plus-16-4",
                "plus-32-8",
                "plus-32-16",
                "plus-64-16",
                "plus-96-24",
                "plus-128-32",
                "plus-192-96",
            )
        ),
        flavor_from_slug("gpu2-128-16-1-200", _GPU_ZONES, _RTX_PRO_6000),
        flavor_from_slug("gpu2-256-32-2-400", _GPU_ZONES, _RTX_PRO_6000),
    ]
}


@dataclass(frozen=True, slots=True)
class ImageSpec:
    slug: str
    name: str
    operating_system: str
    default_username: str
    zones: tuple[str, ...] = ZONES

    def stub(self) -> dict[str, Any]:
        return {
            "slug": self.slug,
            "name": self.name,
            "operating_system": self.operating_system,
            "default_username": self.default_username,
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.stub(), "zones": zone_stubs(self.zones)}


IMAGES: dict[str, ImageSpec] = {
    image.slug: image
    for image in [
        ImageSpec("debian-11", "Debian 11", "Debian", "debian"),
        ImageSpec("debian-12", "Debian 12", "Debian", "debian"),
        ImageSpec("debian-13", "Debian 13", "Debian", "debian"),
        ImageSpec("ubuntu-20.04", "Ubuntu 20.04 LTS", "Ubuntu", "ubuntu", ("rma1",)),
        ImageSpec("ubuntu-22.04", "Ubuntu 22.04 LTS", "Ubuntu", "ubuntu"),
        ImageSpec("ubuntu-24.04", "Ubuntu 24.04 LTS", "Ubuntu", "ubuntu"),
        ImageSpec("rocky-9", "Rocky Linux 9", "Rocky Linux", "rocky"),
        ImageSpec("flatcar-stable", "Flatcar Container Linux (stable)", "Flatcar", "core"),
        ImageSpec("fedora-coreos-stable", "Fedora CoreOS (stable)", "Fedora CoreOS", "core"),
    ]
}


@dataclass(frozen=True, slots=True)
class ServerGroupSpec:
    """A server group the emulator starts with (and gets back on reset)."""

    uuid: str
    name: str
    zone: str


# Present from the start, with fixed uuids so tests and configs can name them; documented in
# docs/emulator.md. More groups are created (and these deleted) through /v1/server-groups.
SERVER_GROUPS: dict[str, ServerGroupSpec] = {
    group.uuid: group
    for group in [
        ServerGroupSpec("5e0a4c1e-0b7a-4d47-8f63-1a2b3c4d5e01", "anti-affinity-rma1-a", "rma1"),
        ServerGroupSpec("5e0a4c1e-0b7a-4d47-8f63-1a2b3c4d5e02", "anti-affinity-rma1-b", "rma1"),
        ServerGroupSpec("5e0a4c1e-0b7a-4d47-8f63-1a2b3c4d5e03", "anti-affinity-lpg1-a", "lpg1"),
    ]
}


@dataclass(frozen=True, slots=True)
class NetworkSpec:
    """A zone's public network or its default private network, with one subnet."""

    uuid: str
    name: str
    subnet_uuid: str
    cidr: str
    subnet: ipaddress.IPv4Network | ipaddress.IPv6Network

    def stub(self, base: str) -> dict[str, str]:
        return {"href": href(base, "networks", self.uuid), "uuid": self.uuid, "name": self.name}

    def subnet_stub(self, base: str) -> dict[str, str]:
        return {
            "href": href(base, "subnets", self.subnet_uuid),
            "uuid": self.subnet_uuid,
            "cidr": self.cidr,
        }

    def address(self, offset: int) -> str:
        """The subnet's address number `offset` (the subnet was parsed once, up front)."""
        return str(self.subnet.network_address + offset)


def _network(zone: str, name: str, cidr: str) -> NetworkSpec:
    return NetworkSpec(
        derived_uuid("network", zone, name),
        name,
        derived_uuid("subnet", zone, cidr),
        cidr,
        ipaddress.ip_network(cidr),
    )


# Documentation/benchmark address ranges (RFC 2544, RFC 3849): never real hosts.
PUBLIC_V4 = {zone: _network(zone, "public", f"198.{18 + i}.0.0/16") for i, zone in enumerate(ZONES)}
PUBLIC_V6 = {
    zone: _network(zone, "public", f"2001:db8:{i + 1}::/48") for i, zone in enumerate(ZONES)
}
PRIVATE = {zone: _network(zone, "privnet", "10.11.0.0/16") for zone in ZONES}


def encode(value: Any) -> bytes:
    """Compact JSON; the one encoder of the emulator (stdlib is fast enough, see docs)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def flavors_body() -> bytes:
    return encode([flavor.to_json() for flavor in FLAVORS.values()])


def images_body() -> bytes:
    return encode([image.to_json() for image in IMAGES.values()])


def regions_body() -> bytes:
    return encode([{"slug": slug, "zones": zone_stubs(zones)} for slug, zones in REGIONS.items()])
