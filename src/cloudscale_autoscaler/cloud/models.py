"""Typed views of the cloudscale.ch API objects we use, parsed defensively.

Unknown fields are ignored and missing optional ones tolerated, so an API that grows new
fields never breaks us; a missing required field (a server without uuid) is a CloudError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TAG_CLUSTER = "k8s-cluster"
TAG_GROUP = "k8s-autoscaler-group"
# Unique per create request, so a create whose response was lost can be found by listing.
TAG_REQUEST = "k8s-autoscaler-request"
# Put on a server (value: the UTC time of the request) before it is deleted, so a deletion that
# a crash interrupted is found, and finished, from the listing alone.
TAG_DELETION = "k8s-autoscaler-deletion-requested"
# On an anti-affinity server group the provider created for a node group (with the cluster and
# group tags): only such server groups are ever deleted.
TAG_MANAGED = "k8s-autoscaler-managed"


@dataclass(frozen=True, slots=True)
class Gpu:
    count: int
    name: str
    vram_per_gpu_gb: float | None = None


@dataclass(frozen=True, slots=True)
class Flavor:
    slug: str
    name: str
    vcpu_count: int
    memory_gb: float
    gpu: Gpu | None = None
    zones: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Image:
    slug: str
    name: str
    operating_system: str = ""
    zones: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Region:
    slug: str
    zones: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerGroup:
    """An anti-affinity server group: it lives in one zone; its members run on distinct hosts."""

    uuid: str
    name: str
    zone: str = ""
    servers: tuple[str, ...] = ()  # member server uuids
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Network:
    """A private network: it lives in one zone and holds the subnets listed."""

    uuid: str
    name: str
    zone: str = ""
    subnets: tuple[str, ...] = ()  # subnet uuids


@dataclass(frozen=True, slots=True)
class Subnet:
    uuid: str
    cidr: str = ""
    network_uuid: str = ""


@dataclass(frozen=True)
class InterfaceRequest:
    """One entry of a create request's `interfaces`: network "public" or a network uuid, and
    optionally the subnet the API assigns the address from."""

    network: str
    subnet: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"network": self.network}
        if self.subnet is not None:
            body["addresses"] = [{"subnet": self.subnet}]
        return body


@dataclass(frozen=True, slots=True)
class Server:
    uuid: str
    name: str
    status: str  # changing | running | stopped | paused | rescue_* | error | unknown
    flavor_slug: str = ""
    zone_slug: str = ""
    created_at: str = ""
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerSpec:
    """Everything a create request carries. `tags` already includes our identity tags."""

    name: str
    flavor: str
    image: str
    zone: str | None = None
    volume_size_gb: int = 10
    ssh_keys: tuple[str, ...] = ()
    server_groups: tuple[str, ...] = ()
    use_public_network: bool = True
    use_private_network: bool = False
    use_ipv6: bool = True
    # Sent instead of use_public_network/use_private_network when not None.
    interfaces: tuple[InterfaceRequest, ...] | None = None
    user_data: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


JSON = dict[str, Any]
