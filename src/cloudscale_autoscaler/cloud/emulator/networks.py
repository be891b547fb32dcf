"""The emulator's private networks and subnets, and the `interfaces` of a server create.

Request shape (cloudscale's SDKs: InterfaceRequest{network, addresses[{subnet, address}]}):
`{"network": "public"}`, `{"network": <uuid>}`, `{"network": <uuid>, "addresses": [{"subnet":
<uuid>}]}`, `{"addresses": [{"subnet": <uuid>}]}` (network taken from the subnet),
`{"network": <uuid>, "addresses": [{"address": <ip>}]}` (subnet omitted, as the SDKs allow)
and `{"network": <uuid>, "addresses": []}` (attached without an address). Error texts, the
zone rule and the choice of subnet are the emulator's assumptions (docs/emulator.md).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from cloudscale_autoscaler.cloud.emulator.catalogue import PRIVATE, ZONES, href

PUBLIC = "public"
INVALID_DICT = "Invalid data. Expected a dictionary, but got {kind}."
DEFAULT_MTU = 9000
DHCP_RANGE = (101, 254)


@dataclass(frozen=True, slots=True)
class SubnetSpec:
    uuid: str
    cidr: str
    network_uuid: str
    zone: str
    gateway: str | None = None

    @property
    def net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.cidr)

    def stub(self, base: str) -> dict[str, str]:
        return {"href": href(base, "subnets", self.uuid), "uuid": self.uuid, "cidr": self.cidr}

    def address(self, host: int) -> str:
        """The `host`-th address of the subnet's DHCP range, wrapping: cloudscale's Ansible
        collection documents it as .101-.254 of the subnet's lowest /24."""
        first, last = DHCP_RANGE
        size = min(last, self.net.num_addresses - 2) - first + 1
        return str(self.net.network_address + first + host % max(size, 1))

    def contains(self, address: str) -> bool:
        try:
            return ipaddress.ip_address(address) in self.net
        except ValueError:
            return False


@dataclass(frozen=True, slots=True)
class PrivateNetworkSpec:
    uuid: str
    name: str
    zone: str
    subnets: tuple[SubnetSpec, ...]

    def stub(self, base: str) -> dict[str, str]:
        return {"href": href(base, "networks", self.uuid), "uuid": self.uuid, "name": self.name}

    def to_json(self, base: str) -> dict[str, Any]:
        return {
            **self.stub(base),
            "created_at": "2026-01-01T00:00:00.000000Z",
            "zone": {"slug": self.zone},
            "mtu": DEFAULT_MTU,
            "subnets": [subnet.stub(base) for subnet in self.subnets],
            "tags": {},
        }


def _network(uuid: str, name: str, zone: str, *subnets: tuple[str, str]) -> PrivateNetworkSpec:
    return PrivateNetworkSpec(
        uuid, name, zone, tuple(SubnetSpec(s_uuid, cidr, uuid, zone) for s_uuid, cidr in subnets)
    )


# Fixed UUIDs so tests and example configs can name them (docs/emulator.md lists them). The
# zones' default private networks (use_private_network) come first, with their existing ids.
NETWORKS: dict[str, PrivateNetworkSpec] = {
    network.uuid: network
    for network in [
        *(
            _network(
                PRIVATE[zone].uuid,
                PRIVATE[zone].name,
                zone,
                (PRIVATE[zone].subnet_uuid, PRIVATE[zone].cidr),
            )
            for zone in ZONES
        ),
        _network(
            "7a1c0000-0000-4000-8000-000000000001",
            "k8s-nodes",
            "lpg1",
            ("7a1c0000-0000-4000-8000-000000000101", "10.20.0.0/24"),
            ("7a1c0000-0000-4000-8000-000000000102", "10.20.1.0/24"),
        ),
        _network(
            "7a1c0000-0000-4000-8000-000000000002",
            "k8s-nodes",
            "rma1",
            ("7a1c0000-0000-4000-8000-000000000201", "10.30.0.0/24"),
        ),
        _network(
            "7a1c0000-0000-4000-8000-000000000003",
            "shared",
            "lpg1",
            ("7a1c0000-0000-4000-8000-000000000301", "10.40.0.0/24"),
        ),
        _network(
            "7a1c0000-0000-4000-8000-000000000004",
            "shared",
            "lpg1",
            ("7a1c0000-0000-4000-8000-000000000401", "10.41.0.0/24"),
        ),
    ]
}
SUBNETS: dict[str, SubnetSpec] = {
    subnet.uuid: subnet for network in NETWORKS.values() for subnet in network.subnets
}


def networks_json(base: str) -> list[dict[str, Any]]:
    return [network.to_json(base) for network in NETWORKS.values()]


def subnets_json(base: str) -> list[dict[str, Any]]:
    return [
        {
            **subnet.stub(base),
            "network": NETWORKS[subnet.network_uuid].stub(base),
            "gateway_address": subnet.gateway,
            "dns_servers": ["5.102.144.101", "5.102.144.102"],
            "tags": {},
        }
        for subnet in SUBNETS.values()
    ]


@dataclass(frozen=True, slots=True)
class Attached:
    """One interface of a created server."""

    network: PrivateNetworkSpec | None  # None: the public network
    subnet: SubnetSpec | None = None  # None on a private network: attached without address
    address: str | None = None  # a fixed address the request asked for


def _kind(value: Any) -> str:
    return "list" if isinstance(value, list) else type(value).__name__


def _without_subnet(
    fixed: Any, network: PrivateNetworkSpec | None, network_given: bool
) -> tuple[dict[str, Any], Attached | None]:
    """An address entry without `subnet` (the SDKs' subnet is optional): the subnet is the
    network's one that holds the fixed address, else its first."""
    if network is None:
        # Without a network there is nothing to take the subnet from; an unknown network
        # is already reported on its own field.
        missing = {"subnet": ["This field is required when the interface has no network."]}
        return ({} if network_given else missing), None
    if fixed is None:
        subnet = network.subnets[0] if network.subnets else None
        if subnet is None:
            return {"subnet": [f"Network {network.uuid} has no subnet."]}, None
        return {}, Attached(network, subnet)
    subnet = next((s for s in network.subnets if s.contains(str(fixed))), None)
    if subnet is None:
        return {
            "address": [f"Address {fixed} is not in any subnet of network {network.uuid}."]
        }, None
    return {}, Attached(network, subnet, fixed)


class _Item:
    """Errors of one `interfaces` entry, in DRF's nested shape."""

    def __init__(self, zone: str) -> None:
        self.zone = zone
        self.errors: dict[str, Any] = {}

    def fail(self, key: str, message: str) -> None:
        self.errors.setdefault(key, []).append(message)

    def network(self, value: Any) -> PrivateNetworkSpec | None:
        network = NETWORKS.get(value) if isinstance(value, str) else None
        if network is None:
            self.fail("network", f"Object with uuid={value} does not exist.")
        elif self.zone and network.zone != self.zone:
            self.fail(
                "network", f"Network {value} is in zone {network.zone}, not in zone {self.zone}."
            )
            return None
        return network

    def address(
        self, raw: Any, network: PrivateNetworkSpec | None, network_given: bool
    ) -> tuple[dict[str, Any], Attached | None]:
        if not isinstance(raw, dict):
            return {"non_field_errors": [INVALID_DICT.format(kind=_kind(raw))]}, None
        if raw.get("subnet") is None:
            return _without_subnet(raw.get("address"), network, network_given)
        errors: dict[str, list[str]] = {}
        ident = raw["subnet"]
        subnet = SUBNETS.get(ident) if isinstance(ident, str) else None
        if subnet is None:
            errors["subnet"] = [f"Object with uuid={ident} does not exist."]
        elif network is not None and subnet.network_uuid != network.uuid:
            errors["subnet"] = [f"Subnet {ident} does not belong to network {network.uuid}."]
        elif self.zone and subnet.zone != self.zone:
            errors["subnet"] = [
                f"Subnet {ident} is in zone {subnet.zone}, not in zone {self.zone}."
            ]
        fixed = raw.get("address")
        if fixed is not None and subnet is not None and not subnet.contains(str(fixed)):
            errors["address"] = [f"Address {fixed} is not in subnet {subnet.cidr}."]
        if errors or subnet is None:
            return errors, None
        return {}, Attached(NETWORKS[subnet.network_uuid], subnet, fixed)

    def parse(self, raw: Any) -> Attached | None:
        if not isinstance(raw, dict):
            self.fail("non_field_errors", INVALID_DICT.format(kind=_kind(raw)))
            return None
        if "network" not in raw and "addresses" not in raw:
            self.fail("non_field_errors", "Either network or addresses must be given.")
            return None
        network_id = raw.get("network")
        if network_id == PUBLIC:
            if raw.get("addresses") is not None:
                self.fail("addresses", "Addresses cannot be chosen on the public network.")
                return None
            return Attached(None)
        network = self.network(network_id) if "network" in raw else None
        if "addresses" not in raw:
            if network is None:
                return None
            # Without addresses the API assigns one from the network's first subnet.
            return Attached(network, network.subnets[0] if network.subnets else None)
        addresses = raw["addresses"]
        if not isinstance(addresses, list):
            self.fail("addresses", f'Expected a list of items but got type "{_kind(addresses)}".')
            return None
        if not addresses:
            return Attached(network) if network is not None else None  # attached, no address
        results = [self.address(entry, network, "network" in raw) for entry in addresses[:1]]
        if len(addresses) > 1:
            self.fail("addresses", "Only one address per interface is supported.")
        errors, attached = results[0]
        if errors:
            self.errors["addresses"] = [errors]
        return None if self.errors else attached


def validate_interfaces(
    body: dict[str, Any], zone: str
) -> tuple[list[Any], tuple[Attached, ...] | None]:
    """(errors for the "interfaces" key, the attached interfaces or None when absent)."""
    if "interfaces" not in body:
        return [], None
    value = body["interfaces"]
    if value is None:
        return ["This field may not be null."], None
    exclusive = [key for key in ("use_public_network", "use_private_network") if key in body]
    if exclusive:
        return [f"Cannot be combined with {' or '.join(exclusive)}."], None
    if not isinstance(value, list):
        return [f'Expected a list of items but got type "{_kind(value)}".'], None
    if not value:
        return ["This list may not be empty."], None
    items = [_Item(zone) for _ in value]
    attached = [checker.parse(raw) for checker, raw in zip(items, value, strict=True)]
    if any(checker.errors for checker in items):
        return [checker.errors for checker in items], None
    return [], tuple(a for a in attached if a is not None)
