"""The names a config uses, checked against the cloudscale.ch API: every group's flavor, image
and zone exist (and the flavor and image are offered in the zone), each private network of its
`interfaces` exists (a name matches exactly one network), each subnet exists and belongs to its
network, and both are in the group's zone.

Run by `check-config --online` (errors refuse the config) and by `serve` at start (logged as
warnings; the API's catalogue can change under a running server).
"""

from __future__ import annotations

from collections.abc import Sequence

from cloudscale_autoscaler.cloud.models import Flavor, Image, Network, Region, Subnet
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.config.values import uuid_error
from cloudscale_autoscaler.engine.networks import by_name, needs_lookup
from cloudscale_autoscaler.settings.types import NetworkInterface, NodeGroupConfig, with_entries


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
    for index, group in with_entries(tuple(groups)):
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


def known(slugs: Sequence[str]) -> str:
    """Slugs for a message: sorted, comma-separated, or `none`."""
    return ", ".join(sorted(slugs)) or "none"


def _custom_image(image: str) -> bool:
    """Custom images (`custom:<slug>` or a UUID) are not in /v1/images; they are not checked."""
    return image.startswith("custom:") or uuid_error(image) is None


def _zone_errors(at: str, kind: str, slug: str, zones: tuple[str, ...], zone: str) -> list[str]:
    # An empty zone list means the API did not say: assume available everywhere.
    if not zones or zone in zones:
        return []
    return [
        f'{at}: {kind} "{slug}" is not available in zone "{zone}" (available in: {known(zones)})'
    ]


def catalogue_errors(
    groups: Sequence[NodeGroupConfig],
    flavors: Sequence[Flavor],
    images: Sequence[Image],
    regions: Sequence[Region],
) -> list[str]:
    """Every group's flavor, image and zone checked against the API's catalogue."""
    by_flavor = {flavor.slug: flavor for flavor in flavors}
    by_image = {image.slug: image for image in images}
    zones = sorted({zone for region in regions for zone in region.zones})
    errors: list[str] = []
    for index, group in with_entries(tuple(groups)):
        at = f"nodeGroups[{index}]"
        flavor = by_flavor.get(group.flavor)
        if flavor is None:
            errors.append(
                f'{at}.flavor: unknown flavor "{group.flavor}" (known: {known(list(by_flavor))})'
            )
        custom = _custom_image(group.image)
        image = None if custom else by_image.get(group.image)
        if image is None and not custom:
            errors.append(
                f'{at}.image: unknown image "{group.image}" (known: {known(list(by_image))})'
            )
        if group.zone is None:
            continue
        if group.zone not in zones:
            where = f"{at}.zone" if group.pool is None else f"{at}.zones"
            errors.append(f'{where}: unknown zone "{group.zone}" (known: {known(zones)})')
            continue
        if flavor is not None:
            errors += _zone_errors(f"{at}.flavor", "flavor", flavor.slug, flavor.zones, group.zone)
        if image is not None:
            errors += _zone_errors(f"{at}.image", "image", image.slug, image.zones, group.zone)
    return list(dict.fromkeys(errors))  # an entry's zones share its flavor and image


Catalogue = tuple[list[Flavor], list[Image], list[Region]]


async def fetch_catalogue(cloud: Cloud) -> Catalogue:
    return await cloud.list_flavors(), await cloud.list_images(), await cloud.list_regions()


async def online_problems(groups: Sequence[NodeGroupConfig], cloud: Cloud) -> list[str]:
    """Every name of `groups` the API does not know (flavors, images, zones, networks and
    subnets), as `<path>: <reason>`; raises CloudError when the API cannot be asked."""
    catalogue = await fetch_catalogue(cloud)
    networks = await networks_to_check(groups, cloud)
    return catalogue_errors(groups, *catalogue) + interface_errors(groups, *networks)
