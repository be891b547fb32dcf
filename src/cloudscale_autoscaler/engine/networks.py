"""A group's configured `interfaces` -> the create request's `interfaces`, names resolved.

A private network may be configured by name; the API only takes UUIDs, so names are looked up
in GET /v1/networks. A name must match exactly one network (in the group's zone, when the group
names one): zero or several matches are an error naming what was found. A group's resolution
is cached for the life of the process once it succeeded, keyed by what it was resolved from
(zone and interfaces), so a reload that changes either resolves again (network UUIDs never
change; a renamed network keeps working until the next restart).
"""

from __future__ import annotations

from collections.abc import Sequence

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import InterfaceRequest, Network
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.config.values import uuid_error
from cloudscale_autoscaler.engine import refusals
from cloudscale_autoscaler.engine.errors import FailedPrecondition
from cloudscale_autoscaler.settings.types import NetworkInterface, NodeGroupConfig


def by_name(name: str, zone: str | None, networks: Sequence[Network]) -> Network | str:
    """The one network called `name` (in `zone` if given), or why there is not exactly one."""
    named = [network for network in networks if network.name == name]
    matches = [network for network in named if zone is None or network.zone == zone]
    where = f" in zone {zone}" if zone is not None else ""
    if len(matches) == 1:
        return matches[0]
    if not matches:
        elsewhere = sorted({network.zone for network in named})
        hint = f" (networks of that name exist in: {', '.join(elsewhere)})" if elsewhere else ""
        return f'no network named "{name}"{where}{hint}'
    uuids = ", ".join(network.uuid for network in matches)
    return f'{len(matches)} networks are named "{name}"{where} ({uuids}): give the UUID instead'


def needs_lookup(interface: NetworkInterface) -> bool:
    return not interface.public and uuid_error(interface.network) is not None


def resolve(
    interface: NetworkInterface, zone: str | None, networks: Sequence[Network]
) -> InterfaceRequest | str:
    if not needs_lookup(interface):
        return InterfaceRequest(interface.network, interface.subnet)
    found = by_name(interface.network, zone, networks)
    if isinstance(found, str):
        return found
    return InterfaceRequest(found.uuid, interface.subnet)


# What a resolution depends on: the group's zone and its configured interfaces.
_Key = tuple[str | None, tuple[NetworkInterface, ...]]


class NetworkResolver:
    def __init__(self, cloud: Cloud) -> None:
        self._cloud = cloud
        self._resolved: dict[_Key, tuple[InterfaceRequest, ...]] = {}

    async def interfaces(self, group: NodeGroupConfig) -> tuple[InterfaceRequest, ...] | None:
        """The group's create-request interfaces; None when the group uses the use_* flags."""
        if group.interfaces is None:
            return None
        key = (group.zone, group.interfaces)
        cached = self._resolved.get(key)
        if cached is not None:
            return cached
        networks: list[Network] = []
        if any(needs_lookup(interface) for interface in group.interfaces):
            try:
                networks = await self._cloud.list_networks()
            except CloudError as error:
                raise refusals.rpc_error(
                    error,
                    f"node group {group.name}: listing networks to resolve network names "
                    f"failed: {error}",
                ) from error
        resolved: list[InterfaceRequest] = []
        for index, interface in enumerate(group.interfaces):
            result = resolve(interface, group.zone, networks)
            if isinstance(result, str):
                raise FailedPrecondition(
                    f"node group {group.name}: interfaces[{index}].network: {result}"
                )
            resolved.append(result)
        self._resolved[key] = tuple(resolved)
        return self._resolved[key]
