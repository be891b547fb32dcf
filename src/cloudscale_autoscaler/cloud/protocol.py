"""The one small interface the engine depends on. client.CloudscaleClient implements it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import (
    Flavor,
    Image,
    Network,
    Region,
    Server,
    ServerGroup,
    ServerSpec,
    Subnet,
)

# Asked right before each attempt to send a create: None while this process may send one,
# else why not (leader election: the Lease lapsed). A create is never sent once it refuses.
Fence = Callable[[], str | None]


class Cloud(Protocol):
    async def list_servers(self, cluster: str) -> list[Server]:
        """Servers tagged k8s-cluster=<cluster> (filtered server-side, checked client-side)."""
        ...

    async def create_server(self, spec: ServerSpec, fence: Fence | None = None) -> Server:
        """Create one server with spec.tags in the create request. Never leaves a duplicate.
        FencedError when `fence` refused before anything was sent, OutcomeUnknownError when
        the server may exist or still appear."""
        ...

    async def set_tags(self, uuid: str, tags: dict[str, str]) -> None:
        """Replace a server's tags (PATCH); idempotent, so safe to retry."""
        ...

    async def delete_server(self, uuid: str) -> None:
        """Delete a server; an unknown uuid (404) counts as already gone."""
        ...

    async def list_server_groups(self, cluster: str) -> list[ServerGroup]:
        """Server groups tagged k8s-cluster=<cluster> (filtered server-side, checked
        client-side), with their members."""
        ...

    async def create_server_group(
        self, name: str, zone: str, tags: dict[str, str], fence: Fence | None = None
    ) -> ServerGroup:
        """Create an anti-affinity server group in `zone` carrying `tags` (`fence` as for
        create_server)."""
        ...

    async def delete_server_group(self, uuid: str) -> None:
        """Delete a server group; an unknown uuid (404) counts as already gone."""
        ...

    async def list_flavors(self) -> list[Flavor]:
        """The flavor catalogue (cached with a TTL by the implementation)."""
        ...

    async def list_images(self) -> list[Image]: ...

    async def list_regions(self) -> list[Region]: ...

    async def list_networks(self) -> list[Network]:
        """The project's private networks (the public network is not listed)."""
        ...

    async def list_subnets(self) -> list[Subnet]: ...

    def failed_since(self, since: float) -> CloudError | None:
        """What the latest attempt that failed and is being retried ended with, if it failed
        after `since` (time.monotonic()): why a call given up on while retries go on had no
        answer."""
        ...

    async def aclose(self) -> None: ...
