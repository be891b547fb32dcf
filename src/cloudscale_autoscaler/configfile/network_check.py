"""`check-config --online` for `interfaces`: each private network exists (a name matches exactly
one network), each subnet exists and belongs to its network, and both are in the group's zone.
"""

from __future__ import annotations

from collections.abc import Sequence

from cloudscale_autoscaler.cloud.models import Network, Subnet
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.config import NetworkInterface, NodeGroupConfig
from cloudscale_autoscaler.engine.networks import by_name, needs_lookup


def uses_private_networks(groups: Sequence[NodeGroupConfig]) -> bool:
    return any(not interface.public for group in groups for interface in group.interfaces or ())


def _shown(network: Network) -> str:
    return f'"{network.name}" ({network.uuid}, zone {network.zone})'


def _network(
    interface: NetworkInterface, zone: str | None, networks: Sequence[Network]
) -> Network | str:
    if needs_lookup(interface):
        return by_name(interface.network, zone, networks)
    wanted = interface.network.lower()
    found = next((n for n in networks if n.uuid.lower() == wanted), None)
    if found is None:
        return f"no network with UUID {interface.network}"
    return found


def _interface_errors(
    at: str,
    interface: NetworkInterface,
    zone: str | None,
    networks: Sequence[Network],
    subnets: dict[str, Subnet],
) -> list[str]:
    network = _network(interface, zone, networks)
    if isinstance(network, str):
        return [f"{at}.network: {network}"]
    errors = []
    if zone is not None and network.zone != zone:
        errors.append(f"{at}.network: network {_shown(network)} is not in the group's zone {zone}")
    if interface.subnet is not None:
        subnet = subnets.get(interface.subnet.lower())
        if subnet is None:
            errors.append(f"{at}.subnet: no subnet with UUID {interface.subnet}")
        elif subnet.network_uuid.lower() != network.uuid.lower():
            owner = next((n for n in networks if n.uuid == subnet.network_uuid), None)
            where = _shown(owner) if owner else subnet.network_uuid
            errors.append(
                f"{at}.subnet: subnet {subnet.uuid} ({subnet.cidr}) belongs to network "
                f"{where}, not to {_shown(network)}"
            )
    return errors


def interface_errors(
    groups: Sequence[NodeGroupConfig], networks: Sequence[Network], subnets: Sequence[Subnet]
) -> list[str]:
    by_uuid = {subnet.uuid.lower(): subnet for subnet in subnets}
    errors: list[str] = []
    for index, group in enumerate(groups):
        for position, interface in enumerate(group.interfaces or ()):
            if interface.public:
                continue
            at = f"nodeGroups[{index}].interfaces[{position}]"
            errors += _interface_errors(at, interface, group.zone, networks, by_uuid)
    return errors


async def networks_to_check(
    groups: Sequence[NodeGroupConfig], cloud: Cloud
) -> tuple[list[Network], list[Subnet]]:
    """The networks and subnets interface_errors needs; none listed when no group uses a
    private network."""
    if not uses_private_networks(groups):
        return [], []
    return await cloud.list_networks(), await cloud.list_subnets()
