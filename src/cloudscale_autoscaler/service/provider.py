"""The CloudProvider gRPC service: RPC messages <-> engine calls, engine errors -> status codes.

Deliberately thin: every decision lives in the engine. Each RPC unpacks its request, calls
the engine and wraps the answer; an EngineError becomes the gRPC status its class maps to,
with the engine's message (which CA logs) unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, Protocol, TypeVar

from google.protobuf import any_pb2, wrappers_pb2
from google.protobuf.message import Message

from cloudscale_autoscaler.engine.engine import Engine
from cloudscale_autoscaler.engine.errors import (
    CloudUnavailable,
    EngineError,
    FailedPrecondition,
    GroupNotFound,
    InvalidArgument,
    PermissionDenied,
    Unimplemented,
)
from cloudscale_autoscaler.engine.group import NodeRef
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.service import pricing
from cloudscale_autoscaler.service.codes import StatusCode
from cloudscale_autoscaler.service.seen import CallsSeen
from cloudscale_autoscaler.settings.types import Config

SERVICE_NAME = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"


class Context(Protocol):
    """What the transport gives each call besides the request."""

    def time_remaining(self) -> float | None: ...

    async def abort(self, code: StatusCode, details: str) -> NoReturn: ...


T = TypeVar("T")
# How long before the caller's deadline cloud work is abandoned, leaving time to answer
# (at most a tenth of the time the caller gave).
DEADLINE_MARGIN_SECONDS = 0.3
API_SLOW = "the cloudscale.ch API is slow"

_CODES: dict[type[EngineError], StatusCode] = {
    GroupNotFound: StatusCode.NOT_FOUND,
    InvalidArgument: StatusCode.INVALID_ARGUMENT,
    FailedPrecondition: StatusCode.FAILED_PRECONDITION,
    PermissionDenied: StatusCode.PERMISSION_DENIED,
    CloudUnavailable: StatusCode.UNAVAILABLE,
    Unimplemented: StatusCode.UNIMPLEMENTED,
}


def status_code(error: EngineError) -> StatusCode:
    for cls in type(error).__mro__:
        code = _CODES.get(cls)
        if code is not None:
            return code
    return StatusCode.INTERNAL


async def _abort(context: Context, error: EngineError) -> NoReturn:
    await context.abort(status_code(error), str(error))
    raise AssertionError("context.abort returned")  # pragma: no cover


async def _run(context: Context, call: Awaitable[T], engine: Engine) -> T:
    try:
        return await _within_deadline(context, call, engine.api_failure_since)
    except EngineError as error:
        await _abort(context, error)


async def _within_deadline(
    context: Context, call: Awaitable[T], failure_since: Callable[[float], str | None]
) -> T:
    """Give up on cloud work shortly before the caller's deadline (CA: 5 s per RPC), so the
    caller gets UNAVAILABLE with the reason instead of timing out blind while the client is
    still retrying. Work the engine shields (deletions, creations) carries on regardless."""
    remaining = context.time_remaining()
    if remaining is None:
        return await call
    budget = remaining - min(DEADLINE_MARGIN_SECONDS, remaining / 10)
    started = time.monotonic()
    try:
        async with asyncio.timeout(budget):
            return await call
    except TimeoutError:
        # An API that failed during the call (and is being retried) is named with its own
        # error; one that failed nothing is slow, not unreachable.
        failure = failure_since(started)
        problem = f"{failure}; still retrying" if failure else API_SLOW
        raise CloudUnavailable(
            f"{problem}: no answer within {budget:.1f} s, given up to answer before the "
            "caller's deadline (work already started goes on; retry)"
        ) from None


def _node_groups(config: Config) -> pb.NodeGroupsResponse:
    return pb.NodeGroupsResponse(
        nodeGroups=[
            pb.NodeGroup(id=g.name, minSize=g.min_size, maxSize=g.max_size)
            for g in config.node_groups
        ]
    )


def _gpu_type_value(gpu_type: str) -> any_pb2.Any:
    """CA reads only the map's keys. An empty Any has no type URL, which generic clients
    cannot decode (grpcurl prints `"@error"`); a packed StringValue every client knows."""
    value = any_pb2.Any()
    value.Pack(wrappers_pb2.StringValue(value=gpu_type))
    return value


class CloudProviderService:
    def __init__(self, config: Config, engine: Engine) -> None:
        # Public for the app's wiring (metrics, readiness).
        self.engine = engine
        self._node_groups = _node_groups(config)
        self._gpu_label = pb.GPULabelResponse(label=config.gpu_label)
        # For the status view: which groups CA last asked to change, and when.
        self.seen = CallsSeen(g.name for g in config.node_groups)

    def reconfigure(self, config: Config) -> list[str]:
        """Serve a reloaded config (Engine.reconfigure, in the same synchronous stretch); the
        groups it removed. gpuLabel is not reloadable (CA reads it once)."""
        node_groups = _node_groups(config)
        removed = self.engine.reconfigure(config)
        self._node_groups = node_groups
        self.seen.follow(g.name for g in config.node_groups)
        return removed

    def constant_answers(self) -> dict[str, Message]:
        """The answers only a config reload changes, by RPC (served by the transport)."""
        return {"NodeGroups": self._node_groups, "GPULabel": self._gpu_label}

    async def NodeGroups(
        self, request: pb.NodeGroupsRequest, context: Context
    ) -> pb.NodeGroupsResponse:
        return self._node_groups

    async def NodeGroupForNode(
        self, request: pb.NodeGroupForNodeRequest, context: Context
    ) -> pb.NodeGroupForNodeResponse:
        return self.engine.node_group_for_node(request.node.providerID)

    async def PricingNodePrice(
        self, request: pb.PricingNodePriceRequest, context: Context
    ) -> pb.PricingNodePriceResponse:
        pricer = self.engine.pricing
        if pricer is None:
            await _abort(context, Unimplemented("PricingNodePrice is not implemented: no prices"))
        try:
            return pricing.node_price(pricer, request)
        except EngineError as error:
            await _abort(context, error)

    async def PricingPodPrice(
        self, request: pb.PricingPodPriceRequest, context: Context
    ) -> pb.PricingPodPriceResponse:
        pricer = self.engine.pricing
        if pricer is None:
            await _abort(context, Unimplemented("PricingPodPrice is not implemented: no prices"))
        return await _run(context, pricing.pod_price(pricer, request), self.engine)

    async def GPULabel(self, request: pb.GPULabelRequest, context: Context) -> pb.GPULabelResponse:
        return self._gpu_label

    async def GetAvailableGPUTypes(
        self, request: pb.GetAvailableGPUTypesRequest, context: Context
    ) -> pb.GetAvailableGPUTypesResponse:
        types = await _run(context, self.engine.gpu_types(), self.engine)
        return pb.GetAvailableGPUTypesResponse(gpuTypes={t: _gpu_type_value(t) for t in types})

    async def Cleanup(self, request: pb.CleanupRequest, context: Context) -> pb.CleanupResponse:
        # CA calls Cleanup when it shuts down; we hold no per-client resources.
        return pb.CleanupResponse()

    async def Refresh(self, request: pb.RefreshRequest, context: Context) -> pb.RefreshResponse:
        await _run(context, self.engine.refresh(), self.engine)
        return pb.RefreshResponse()

    async def NodeGroupTargetSize(
        self, request: pb.NodeGroupTargetSizeRequest, context: Context
    ) -> pb.NodeGroupTargetSizeResponse:
        try:
            size = self.engine.target_size(request.id)
        except EngineError as error:
            await _abort(context, error)
        return pb.NodeGroupTargetSizeResponse(targetSize=size)

    async def NodeGroupIncreaseSize(
        self, request: pb.NodeGroupIncreaseSizeRequest, context: Context
    ) -> pb.NodeGroupIncreaseSizeResponse:
        self.seen.record(request.id, "NodeGroupIncreaseSize")
        await _run(context, self.engine.increase_size(request.id, request.delta), self.engine)
        return pb.NodeGroupIncreaseSizeResponse()

    async def NodeGroupDeleteNodes(
        self, request: pb.NodeGroupDeleteNodesRequest, context: Context
    ) -> pb.NodeGroupDeleteNodesResponse:
        self.seen.record(request.id, "NodeGroupDeleteNodes")
        nodes = [NodeRef(node.providerID, node.name) for node in request.nodes]
        await _run(context, self.engine.delete_nodes(request.id, nodes), self.engine)
        return pb.NodeGroupDeleteNodesResponse()

    async def NodeGroupDecreaseTargetSize(
        self, request: pb.NodeGroupDecreaseTargetSizeRequest, context: Context
    ) -> pb.NodeGroupDecreaseTargetSizeResponse:
        self.seen.record(request.id, "NodeGroupDecreaseTargetSize")
        try:
            self.engine.decrease_target_size(request.id, request.delta)
        except EngineError as error:
            await _abort(context, error)
        return pb.NodeGroupDecreaseTargetSizeResponse()

    async def NodeGroupNodes(
        self, request: pb.NodeGroupNodesRequest, context: Context
    ) -> pb.NodeGroupNodesResponse:
        try:
            return self.engine.nodes(request.id)
        except EngineError as error:
            await _abort(context, error)

    async def NodeGroupTemplateNodeInfo(
        self, request: pb.NodeGroupTemplateNodeInfoRequest, context: Context
    ) -> pb.NodeGroupTemplateNodeInfoResponse:
        return await _run(context, self.engine.template_node_info(request.id), self.engine)

    async def NodeGroupGetOptions(
        self, request: pb.NodeGroupAutoscalingOptionsRequest, context: Context
    ) -> pb.NodeGroupAutoscalingOptionsResponse:
        try:
            return self.engine.autoscaling_options(request.id, request.defaults)
        except EngineError as error:
            await _abort(context, error)
