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


def _seconds(moment: Moment) -> Fraction:
    return moment.seconds + Fraction(moment.nanos, _NANOS)


def _interval(request: pb.PricingNodePriceRequest | pb.PricingPodPriceRequest) -> Fraction:
    """The request's interval in seconds, from the Timestamp pair if sent, else the older
    meta.v1 Time pair."""
    chosen: tuple[Moment, Moment] | None = None
    if request.HasField("startTimestamp") and request.HasField("endTimestamp"):
        chosen = (request.startTimestamp, request.endTimestamp)
    elif request.HasField("startTime") and request.HasField("endTime"):
        chosen = (request.startTime, request.endTime)
    if chosen is None:
        raise InvalidArgument(
            "missing interval: expected startTimestamp and endTimestamp (or the older "
            "startTime and endTime)"
        )
    try:
        return interval_seconds(_seconds(chosen[0]), _seconds(chosen[1]))
    except ValueError as error:
        raise InvalidArgument(str(error)) from error


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
