"""One emulated server and its wire JSON; one emulated server group.

The JSON is rendered lazily and cached (per status and base URL), so listing thousands of
servers costs one bytes join, and bulk-populating them costs no JSON work at all. Anything that
changes what the JSON shows (tags, name) must call `touch()`.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

from cloudscale_autoscaler.cloud.emulator.catalogue import (
    PRIVATE,
    PUBLIC_V4,
    PUBLIC_V6,
    FlavorSpec,
    ImageSpec,
    NetworkSpec,
    derived_uuid,
    encode,
    href,
)
from cloudscale_autoscaler.cloud.emulator.networks import Attached

# Host numbers wrap within the /16 subnets; addresses are decoration, never looked up.
_HOSTS_PER_SUBNET = 65_000
SERVER_GROUP_TYPE = "anti-affinity"


@dataclass(slots=True, eq=False)
class ServerGroupRecord:
    """An anti-affinity server group. Its members are the servers created with it in their
    `server_groups` (the state's index); a member shows the group's current name, so renaming
    a group must touch() its members."""

    uuid: str
    name: str
    zone: str
    tags: dict[str, str] = field(default_factory=dict)

    def stub(self, base: str) -> dict[str, str]:
        """The group as embedded in a server object."""
        return {
            "href": href(base, "server-groups", self.uuid),
            "uuid": self.uuid,
            "name": self.name,
        }

    def to_json(self, base: str, members: list[ServerRecord]) -> dict[str, Any]:
        return {
            "href": href(base, "server-groups", self.uuid),
            "uuid": self.uuid,
            "name": self.name,
            "type": SERVER_GROUP_TYPE,
            "servers": [
                {"href": href(base, "servers", m.uuid), "uuid": m.uuid, "name": m.name}
                for m in members
            ],
            "zone": {"slug": self.zone},
            "tags": dict(self.tags),
        }


@dataclass(slots=True, eq=False)
class ServerRecord:
    uuid: str
    seq: int  # creation order: the order of every listing
    name: str
    zone: str
    flavor: FlavorSpec
    image: ImageSpec
    created_at: str  # ISO 8601 with microseconds and "Z", like the real API
    ready_at: float  # monotonic time at which a booting server turns "running"
    volume_size_gb: int = 10
    use_public_network: bool = True
    use_private_network: bool = False
    use_ipv6: bool = True
    interfaces: tuple[Attached, ...] | None = None  # from the request; None: use_* flags
    ssh_keys: tuple[str, ...] = ()
    server_groups: tuple[ServerGroupRecord, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)
    user_data: str | None = None
    fixed_status: str | None = None  # set by the admin API; never changes by itself
    deleting_until: float | None = None  # DELETE answered, still listed until then
    _cached_key: tuple[str, str] | None = None  # (status, base) the cached JSON shows
    _cached_json: bytes = b""

    def status(self, now: float) -> str:
        if self.deleting_until is not None:
            return "changing"
        if self.fixed_status is not None:
            return self.fixed_status
        return "running" if now >= self.ready_at else "changing"

    def touch(self) -> None:
        self._cached_key = None

    def json_bytes(self, status: str, base: str) -> bytes:
        if self._cached_key != (status, base):
            self._cached_json = encode(self.to_json(status, base))
            self._cached_key = (status, base)
        return self._cached_json

    def to_json(self, status: str, base: str) -> dict[str, Any]:
        volume_uuid = derived_uuid("volume", self.uuid)
        running = status == "running"
        return {
            "href": href(base, "servers", self.uuid),
            "uuid": self.uuid,
            "name": self.name,
            "status": status,
            "created_at": self.created_at,
            "zone": {"slug": self.zone},
            "flavor": self.flavor.stub(),
            "image": self.image.stub(),
            "volumes": [
                {
                    "href": href(base, "volumes", volume_uuid),
                    "uuid": volume_uuid,
                    "name": f"{self.name}-root",
                    "type": "ssd",
                    "size_gb": self.volume_size_gb,
                }
            ],
            "interfaces": self._interfaces(base),
            # Host keys are known once the server has booted (an assumption, see docs).
            "ssh_fingerprints": self._fingerprints() if running else [],
            "ssh_host_keys": self._host_keys() if running else [],
            "server_groups": [group.stub(base) for group in self.server_groups],
            "anti_affinity_with": [],
            "tags": dict(self.tags),
        }

    def _interfaces(self, base: str) -> list[dict[str, Any]]:
        if self.interfaces is not None:
            return [self._requested(base, attached) for attached in self.interfaces]
        interfaces: list[dict[str, Any]] = []
        host = self.seq % _HOSTS_PER_SUBNET
        if self.use_public_network:
            interfaces.append(self._public(base))
        if self.use_private_network:
            net = PRIVATE[self.zone]
            addresses = [self._address(base, net, host + 10, None)]
            interfaces.append(
                {"type": "private", "network": net.stub(base), "addresses": addresses}
            )
        return interfaces

    def _public(self, base: str) -> dict[str, Any]:
        host = self.seq % _HOSTS_PER_SUBNET
        v4 = PUBLIC_V4[self.zone]
        addresses = [self._address(base, v4, host + 2, v4.address(1))]
        if self.use_ipv6:
            # One /64 per server inside the zone's /48, like a routed prefix.
            v6 = PUBLIC_V6[self.zone]
            addresses.append(self._address(base, v6, ((host + 1) << 64) + 1, "fe80::1", 64))
        return {"type": "public", "network": v4.stub(base), "addresses": addresses}

    def _requested(self, base: str, attached: Attached) -> dict[str, Any]:
        if attached.network is None:
            return self._public(base)
        addresses = []
        subnet = attached.subnet
        if subnet is not None:
            addresses.append(
                {
                    "version": 4,
                    "address": attached.address or subnet.address(self.seq),
                    "prefix_length": subnet.net.prefixlen,
                    "gateway": subnet.gateway,
                    "reverse_ptr": self.name,
                    "subnet": subnet.stub(base),
                }
            )
        return {"type": "private", "network": attached.network.stub(base), "addresses": addresses}

    def _address(
        self,
        base: str,
        net: NetworkSpec,
        offset: int,
        gateway: str | None,
        prefix_length: int = 0,
    ) -> dict[str, Any]:
        return {
            "version": net.subnet.version,
            "address": net.address(offset),
            "prefix_length": prefix_length or net.subnet.prefixlen,
            "gateway": gateway,
            "reverse_ptr": self.name,
            "subnet": net.subnet_stub(base),
        }

    def _key_material(self) -> bytes:
        return hashlib.sha256(self.uuid.encode()).digest()

    def _fingerprints(self) -> list[str]:
        digest = base64.b64encode(hashlib.sha256(self._key_material()).digest()).decode()
        return [f"ssh-ed25519 SHA256:{digest.rstrip('=')}"]

    def _host_keys(self) -> list[str]:
        blob = base64.b64encode(
            b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + self._key_material()
        ).decode()
        return [f"ssh-ed25519 {blob} root@{self.name}"]
