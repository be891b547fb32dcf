"""The pricing RPCs' requests -> the engine's Pricer: both proto generations read.

CA <= 1.34.1 sends k8s meta.v1.Time (startTime=2/endTime=3) and, for PodPrice, the Pod message
(pod=1); CA 1.35+ sends google.protobuf.Timestamp (4/5 for NodePrice, 5/6 for PodPrice) and
pod_bytes=4; 1.34.2+ sends both, and the newer fields win.
"""

from __future__ import annotations

from fractions import Fraction

from google.protobuf import timestamp_pb2
from google.protobuf.message import DecodeError

from cloudscale_autoscaler.engine.errors import InvalidArgument
from cloudscale_autoscaler.engine.pricing import Pricer, interval_seconds
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.protos.k8s.apimachinery import meta_v1_pb2

_NANOS = 10**9
Moment = timestamp_pb2.Timestamp | meta_v1_pb2.Time
Request = pb.PricingNodePriceRequest | pb.PricingPodPriceRequest
# Newest generation first: the first complete pair wins.
_PAIRS = (("startTimestamp", "endTimestamp"), ("startTime", "endTime"))


def _seconds(request: Request, field: str) -> Fraction:
    moment: Moment = getattr(request, field)
    if not 0 <= moment.nanos < _NANOS:
        raise InvalidArgument(
            f"{field}.nanos must be between 0 and {_NANOS - 1}, got {moment.nanos}"
        )
    return moment.seconds + Fraction(moment.nanos, _NANOS)


def _interval(request: Request) -> Fraction:
    """The request's interval in seconds, from the Timestamp pair if sent, else the older
    meta.v1 Time pair."""
    for start, end in _PAIRS:
        if request.HasField(start) and request.HasField(end):
            try:
                return interval_seconds(_seconds(request, start), _seconds(request, end))
            except ValueError as error:
                raise InvalidArgument(str(error)) from error
    raise InvalidArgument(
        "missing interval: expected startTimestamp and endTimestamp (or the older "
        "startTime and endTime)"
    )


def node_price(pricer: Pricer, request: pb.PricingNodePriceRequest) -> pb.PricingNodePriceResponse:
    seconds = _interval(request)
    node = request.node
    price = pricer.node_price(node.providerID, node.name, node.labels, node.annotations, seconds)
    return pb.PricingNodePriceResponse(price=price)


def _pod(request: pb.PricingPodPriceRequest) -> core_v1_pb2.Pod:
    if request.pod_bytes:
        try:
            return core_v1_pb2.Pod.FromString(request.pod_bytes)
        except DecodeError as error:
            raise InvalidArgument(f"pod_bytes is not a proto-marshalled v1.Pod: {error}") from error
    if request.HasField("pod"):
        return request.pod
    raise InvalidArgument("missing pod: expected pod_bytes (or the older pod)")


async def pod_price(
    pricer: Pricer, request: pb.PricingPodPriceRequest
) -> pb.PricingPodPriceResponse:
    seconds = _interval(request)
    price = await pricer.pod_price(_pod(request), seconds)
    return pb.PricingPodPriceResponse(price=price)
