"""Flavor-derived answers: template nodes and GPU types, cached.

The flavor list comes from the cloud (the client caches it with a TTL); built template
responses are kept until a Refresh finds the list changed (or had none), since a template
depends only on config and flavor. Refresh builds every group's template at once when it has
the flavor list (or knows it cannot have it), so the transport can serve them all from the
first call on (service/hot.py) instead of asking the event loop once per node when CA starts.

When the list cannot be fetched, the flavor is read from its slug (template.slug), so
templates survive a failing flavors endpoint and work offline (a full API outage still fails
Refresh, on the server listing); the list, when present, wins. Only a GPU slug's model cannot
be read: see node_labels.

No call waits long for the list: CA gives each call 5 s. A fetch is waited for at most
FLAVOR_WAIT_SECONDS. One that failed makes calls answer from the slugs at once until the next
Refresh tries again; one that is merely slow goes on in the background, and each later call
waits for it again (as long at most) and takes the list once it is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.engine.errors import CloudUnavailable, EngineError, FailedPrecondition
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.settings.types import Config, NodeGroupConfig
from cloudscale_autoscaler.template.labels import gpu_label_value, label_sources
from cloudscale_autoscaler.template.node import template_node_bytes
from cloudscale_autoscaler.template.slug import flavor_from_slug
from cloudscale_autoscaler.template.userdata import UserDataError, placeholders_in

log = logging.getLogger(__name__)

# How long a call waits for the flavor list. The client's fetch (shared, with its retries) goes
# on in the background and fills its cache, where the next call finds it.
FLAVOR_WAIT_SECONDS = 1.0


class Catalog:
    def __init__(self, config: Config, cloud: Cloud) -> None:
        self._config = config
        self._cloud = cloud
        self._flavors: dict[str, Flavor] | None = None
        # Why the last fetch failed (not merely slow); kept until the next Refresh, so that calls
        # meanwhile read the slugs at once instead of each waiting for the flavor list again.
        self._failure: str | None = None
        self._templates: dict[str, pb.NodeGroupTemplateNodeInfoResponse] = {}

    async def refresh(self) -> None:
        """Re-read flavors (cheap within the client's TTL) and build the templates again if
        they changed. A failure keeps the flavors we have: templates do not justify failing
        CA's Refresh."""
        previous = self._flavors
        self._failure = None
        try:
            await self._fetch()
        except CloudUnavailable as error:
            log.warning(
                "keeping %s: %s", "cached flavors" if self._flavors else "no flavors", error
            )
        if previous is None or self._flavors != previous:
            # A new mapping, not a cleared one: the published answers follow its identity.
            self._templates = {}
        if self._flavors is not None or self._failure is not None:  # nothing to wait for
            await self._build_all()

    async def _build_all(self) -> None:
        for group in self._config.node_groups:
            # A group whose template cannot be built is left to its calls, which say why.
            with contextlib.suppress(EngineError):
                await self.template(group)

    def reconfigure(self, config: Config) -> None:
        """Templates from a reloaded config: dropped (a new mapping, so the transport's
        answers are replaced), built again by `warm` or on demand."""
        self._config = config
        self._templates = {}

    async def warm(self) -> None:
        """Build the templates from the flavors already fetched (after a reload)."""
        if self._flavors is not None or self._failure is not None:
            await self._build_all()

    @property
    def templates(self) -> Mapping[str, pb.NodeGroupTemplateNodeInfoResponse]:
        """The templates built, by group (a new mapping whenever Refresh drops them)."""
        return self._templates

    async def ensure(self) -> None:
        """Have the flavor list if it can be had (for labels and checks); failing is not fatal."""
        with contextlib.suppress(CloudUnavailable):  # logged by the fetch that failed
            await self.flavors()

    async def flavors(self) -> dict[str, Flavor]:
        """The flavor list; CloudUnavailable at once when a fetch failed since the last
        Refresh, after FLAVOR_WAIT_SECONDS when the fetch is still under way."""
        if self._flavors is None and self._failure is None:
            try:
                await self._fetch()
            except CloudUnavailable as error:
                log.warning("no flavor list, reading flavors from their slugs: %s", error)
                raise
        if self._flavors is None:
            raise CloudUnavailable(f"{self._failure} (the next Refresh tries again)")
        return self._flavors

    async def _fetch(self) -> None:
        try:
            async with asyncio.timeout(FLAVOR_WAIT_SECONDS):
                flavors = await self._cloud.list_flavors()
        except TimeoutError:
            # Not a failure: the client's fetch goes on, and the next call waits for it again.
            raise CloudUnavailable(
                f"listing flavors: no answer within {FLAVOR_WAIT_SECONDS:g} s "
                "(still fetching; later calls wait for it again)"
            ) from None
        except CloudError as error:
            self._failure = f"listing flavors failed: {error}"
            raise CloudUnavailable(f"{self._failure} (the next Refresh tries again)") from error
        self._flavors = {flavor.slug: flavor for flavor in flavors}

    async def template(self, group: NodeGroupConfig) -> pb.NodeGroupTemplateNodeInfoResponse:
        cached = self._templates.get(group.name)
        if cached is not None:
            return cached
        flavor = await self._flavor_of(group)
        data = template_node_bytes(self._config.cluster, group, flavor, self._config.gpu_label)
        # Field 1 for CA <= 1.34.1, field 2 for newer CA: the same Node in both.
        response = pb.NodeGroupTemplateNodeInfoResponse(
            nodeInfo=core_v1_pb2.Node.FromString(data), nodeBytes=data
        )
        self._templates[group.name] = response
        return response

    async def _flavor_of(self, group: NodeGroupConfig) -> Flavor:
        try:
            flavors = await self.flavors()
        except CloudUnavailable as error:
            flavor = flavor_from_slug(group.flavor)
            if flavor is None:
                raise FailedPrecondition(
                    f"node group {group.name}: {error}, and the flavor slug {group.flavor!r} "
                    "does not say its size (expected flex-<GB>-<vCPUs>, plus-<GB>-<vCPUs> or "
                    "gpu<n>-<GB>-<vCPUs>-<GPUs>-<n>)"
                ) from error
            log.warning(
                "node group %s: template from the flavor slug %s (%d vCPUs, %g GB): %s",
                group.name,
                flavor.slug,
                flavor.vcpu_count,
                flavor.memory_gb,
                error,
            )
            return flavor
        flavor = flavors.get(group.flavor)
        if flavor is None:
            raise FailedPrecondition(_unknown_flavor(group, flavors))
        return flavor

    def node_labels(self, group: NodeGroupConfig) -> dict[str, str]:
        """What `${node_labels}` must carry for the group's servers to have every label of
        its template (judged from the flavors already fetched, else from the slug).

        A GPU slug does not name its GPU model: without the flavor list the GPU label would
        be "unknown", and a server keeps the labels it was created with. So creating servers
        whose userData passes `${node_labels}` waits for the list (CloudUnavailable); the
        template alone may say "unknown" meanwhile, as CA rebuilds it every loop."""
        flavor = (self._flavors or {}).get(group.flavor) or flavor_from_slug(group.flavor)
        if flavor is None:
            flavor = Flavor(group.flavor, group.flavor, 0, 0)  # no GPU known
        labels = label_sources(group, flavor, self._config.gpu_label).node_labels
        gpu_label = self._config.gpu_label
        if self._flavors is None and gpu_label in labels and _passes_node_labels(group):
            raise CloudUnavailable(
                f"node group {group.name}: the flavor list cannot be read and the slug "
                f"{group.flavor} does not name its GPU model, so ${{node_labels}} would label "
                f"the servers {gpu_label}={labels[gpu_label]} for good; not creating servers "
                "until the flavor list can be read (every Refresh tries again)"
            )
        return labels

    def creation_problem(self, group: NodeGroupConfig) -> str | None:
        """Why the cloud would certainly refuse to create the group's servers, judged from the
        flavors already fetched (no API call): an unknown flavor, or one the group's zone does
        not offer. None when nothing is known against it."""
        if self._flavors is None:
            return None
        flavor = self._flavors.get(group.flavor)
        if flavor is None:
            return _unknown_flavor(group, self._flavors)
        if group.zone is not None and flavor.zones and group.zone not in flavor.zones:
            offered = ", ".join(flavor.zones)
            return (
                f"node group {group.name}: flavor {group.flavor!r} is not offered in zone "
                f"{group.zone!r} (only in: {offered})"
            )
        return None

    async def gpu_types(self) -> list[str]:
        """GPU types of the configured GPU flavors, spelled as the template's GPU label value
        (CA looks the node's label value up in this set)."""
        flavors = await self.flavors()
        types = set()
        for group in self._config.node_groups:
            flavor = flavors.get(group.flavor)
            if flavor is not None and flavor.gpu is not None and flavor.gpu.count > 0:
                types.add(gpu_label_value(flavor.gpu.name))
        return sorted(types)


def _unknown_flavor(group: NodeGroupConfig, flavors: dict[str, Flavor]) -> str:
    known = ", ".join(sorted(flavors)) or "none"
    return (
        f"node group {group.name}: flavor {group.flavor!r} is not offered by the cloud "
        f"(known flavors: {known})"
    )


def _passes_node_labels(group: NodeGroupConfig) -> bool:
    try:
        return "node_labels" in placeholders_in(group.user_data or "")
    except UserDataError:
        return False  # building the request reports the malformed template
