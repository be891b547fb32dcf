"""A node group's `interfaces:` list: which networks its servers are attached to.

Each entry is `public` (or `{network: public}`) or a private network `{network: <uuid or
name>, subnet: <uuid>}` with the subnet optional. Addresses are always assigned by the API: a
fixed address would be the same for every server of the group. The API refuses `interfaces`
together with `use_public_network`/`use_private_network`, and so does the loader.
"""

from __future__ import annotations

from typing import Any

from cloudscale_autoscaler.config.reader import Fields, Issues, describe, item
from cloudscale_autoscaler.config.values import uuid_error
from cloudscale_autoscaler.settings.types import PUBLIC_NETWORK, NetworkInterface, NodeGroupConfig

ENTRY_KEYS = ("network", "subnet")
# The API's own keys for fixed addresses, refused with a reason rather than "unknown key".
_ADDRESS_KEYS = ("address", "addresses")
EXCLUSIVE_KEYS = ("usePublicNetwork", "usePrivateNetwork")
ZONE_REQUIRED = (
    "required when interfaces name a private network (or give `zones`): networks are zonal, "
    "and without a zone the API creates servers in the project's default zone"
)
ONE_ZONE_ONLY = (
    "is in one zone, but `zones` lists several: name the network instead (each zone's "
    "network of that name is used)"
)
NO_FIXED_ADDRESS = (
    "fixed addresses are not supported: every server of the group would get the same "
    "address; the API assigns one from the subnet"
)


def parse_interfaces(group: Fields) -> tuple[NetworkInterface, ...] | None:
    """The group's interfaces, None when not given. Problems are recorded in group.issues."""
    entries = group.sequence("interfaces")
    if entries is None:
        return None
    at = group.at("interfaces")
    given = [key for key in EXCLUSIVE_KEYS if group.present(key)]
    if given:
        group.issues.add(
            at,
            f"cannot be combined with {' and '.join(given)} (the API refuses both in one "
            "request): describe the public network as an entry `public` instead",
        )
    if not entries:
        group.issues.add(at, "must contain at least one interface (or leave interfaces out)")
    parsed: list[tuple[int, NetworkInterface]] = []
    for index, raw in enumerate(entries):
        entry = _entry(group.issues, item(at, index), raw)
        if entry is not None:
            parsed.append((index, entry))
    _check_duplicates(group.issues, at, parsed)
    zones = group.raw("zones")
    if any(not entry.public for _, entry in parsed) and not (group.present("zone") or zones):
        group.issues.add(group.at("zone"), ZONE_REQUIRED)
    if isinstance(zones, list) and len(zones) > 1:
        _check_zonal(group.issues, at, parsed)
    return tuple(entry for _, entry in parsed)


def _check_zonal(issues: Issues, at: str, interfaces: list[tuple[int, NetworkInterface]]) -> None:
    """With several zones a network or subnet given by UUID fits only one of them."""
    for index, interface in interfaces:
        if interface.public:
            continue
        if uuid_error(interface.network) is None:
            issues.add(f"{item(at, index)}.network", f"a network given by UUID {ONE_ZONE_ONLY}")
        if interface.subnet is not None:
            issues.add(
                f"{item(at, index)}.subnet",
                f"a subnet {ONE_ZONE_ONLY}, and leave the subnet out",
            )


def _entry(issues: Issues, path: str, raw: Any) -> NetworkInterface | None:
    if raw == PUBLIC_NETWORK:
        return NetworkInterface(PUBLIC_NETWORK)
    if not isinstance(raw, dict):
        issues.add(
            path,
            f'expected "public" or a mapping {{network: UUID or name, subnet: UUID}}, '
            f"got {describe(raw)}",
        )
        return None
    for key in _ADDRESS_KEYS:
        if key in raw:
            issues.add(f"{path}.{key}", NO_FIXED_ADDRESS)
    rest = {key: value for key, value in raw.items() if key not in _ADDRESS_KEYS}
    fields = Fields(issues, path, rest, ENTRY_KEYS)
    network = fields.string("network", required=True)
    subnet = fields.string("subnet")
    if network is None:
        return None
    if subnet is not None:
        if network == PUBLIC_NETWORK:
            issues.add(fields.at("subnet"), "the public network has no subnet to choose")
            return None
        if not issues.check(fields.at("subnet"), uuid_error(subnet)):
            return None
    # UUIDs in their canonical lowercase form: the API's lookups need not ignore case.
    if uuid_error(network) is None:
        network = network.lower()
    return NetworkInterface(network, subnet.lower() if subnet is not None else None)


def _check_duplicates(
    issues: Issues, at: str, interfaces: list[tuple[int, NetworkInterface]]
) -> None:
    # Two interfaces on one network would give each server two addresses in one broadcast
    # domain: almost certainly a copy-paste mistake.
    first: dict[str, int] = {}
    for index, interface in interfaces:
        if interface.network in first:
            issues.add(
                item(at, index),
                f'network "{interface.network}" is already attached by '
                f"{item(at, first[interface.network])}",
            )
        else:
            first[interface.network] = index


def interfaces_text(group: NodeGroupConfig) -> str:
    """The group's interfaces for summaries: `public, k8s-nodes (subnet <uuid>)`."""
    if group.interfaces is None:
        flags = [
            name
            for name, used in (
                ("public", group.use_public_network),
                ("default private", group.use_private_network),
            )
            if used
        ]
        return " + ".join(flags) or "none"
    return ", ".join(
        interface.network + (f" (subnet {interface.subnet})" if interface.subnet else "")
        for interface in group.interfaces
    )
