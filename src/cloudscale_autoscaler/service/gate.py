"""The CloudProvider service behind the serving gate (leader election).

`gated(service, serving)` answers every RPC the service implements with UNAVAILABLE, naming
the leader, while `serving` is closed, and otherwise calls the service unchanged. It is used
only with leader election on, so a single replica pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.service.codes import StatusCode
from cloudscale_autoscaler.service.provider import CloudProviderService, Context
from cloudscale_autoscaler.service.serving import Serving

RPC = Callable[[Any, Any, Context], Awaitable[Any]]


class GatedService:
    def __init__(self, service: CloudProviderService, serving: Serving) -> None:
        self.service = service
        self.serving = serving
        self.engine = service.engine


def _gate(implementation: RPC) -> RPC:
    async def rpc(self: GatedService, request: Any, context: Context) -> Any:
        refusal = self.serving.refusal()
        if refusal is not None:
            await context.abort(StatusCode.UNAVAILABLE, refusal)
        return await implementation(self.service, request, context)

    rpc.__name__ = implementation.__name__
    return rpc


for _method in pb.DESCRIPTOR.services_by_name["CloudProvider"].methods:
    _own = getattr(CloudProviderService, _method.name, None)
    if _own is not None:
        setattr(GatedService, _method.name, _gate(_own))


def gated(service: CloudProviderService, serving: Serving) -> GatedService:
    return GatedService(service, serving)
