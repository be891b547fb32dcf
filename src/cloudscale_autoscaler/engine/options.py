"""NodeGroupGetOptions answers: the group's overrides, CA's defaults for the rest, every
duration in both wire generations (meta.v1.Duration in 3/4/5 for CA <= 1.34, and
google.protobuf.Duration in 8/9/10/11 for CA >= 1.34.2), because CA turns an unset duration
into 0 s."""

from __future__ import annotations

from google.protobuf import duration_pb2

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos.k8s.apimachinery import meta_v1_pb2
from cloudscale_autoscaler.settings.types import AutoscalingOptions

_NANOS = 1_000_000_000

# (old meta.v1 field or None, new google.protobuf field, AutoscalingOptions attribute)
_DURATIONS: tuple[tuple[str | None, str, str], ...] = (
    ("scaleDownUnneededTime", "scaleDownUnneededDuration", "scale_down_unneeded_seconds"),
    ("scaleDownUnreadyTime", "scaleDownUnreadyDuration", "scale_down_unready_seconds"),
    ("MaxNodeProvisionTime", "MaxNodeProvisionDuration", "max_node_provision_seconds"),
    (None, "maxNodeStartupDuration", "max_node_startup_seconds"),
)
# (wire field, AutoscalingOptions attribute) for doubles and booleans
_SCALARS: tuple[tuple[str, str], ...] = (
    ("scaleDownUtilizationThreshold", "scale_down_utilization_threshold"),
    ("scaleDownGpuUtilizationThreshold", "scale_down_gpu_utilization_threshold"),
    ("zeroOrMaxNodeScaling", "zero_or_max_node_scaling"),
    ("ignoreDaemonSetsUtilization", "ignore_daemonsets_utilization"),
    ("allowNonAtomicScaleUpToMax", "allow_non_atomic_scale_up_to_max"),
)


def seconds_to_nanos(seconds: float) -> int:
    return round(seconds * _NANOS)


def default_duration_nanos(
    defaults: pb.NodeGroupAutoscalingOptions, old: str | None, new: str
) -> int:
    """A default duration from the request: the new field if sent, else the old one, else 0."""
    if defaults.HasField(new):
        value: duration_pb2.Duration = getattr(defaults, new)
        return value.seconds * _NANOS + value.nanos
    if old is not None and defaults.HasField(old):
        old_value: meta_v1_pb2.Duration = getattr(defaults, old)
        return old_value.duration
    return 0


def depends_on_defaults(options: AutoscalingOptions) -> bool:
    """Whether some field is left to CA's defaults (else one answer serves every request)."""
    attrs = [attr for _, _, attr in _DURATIONS] + [attr for _, attr in _SCALARS]
    return any(getattr(options, attr) is None for attr in attrs)


def build_options(
    options: AutoscalingOptions, defaults: pb.NodeGroupAutoscalingOptions
) -> pb.NodeGroupAutoscalingOptionsResponse:
    out = pb.NodeGroupAutoscalingOptions()
    for field, attr in _SCALARS:
        override = getattr(options, attr)
        setattr(out, field, getattr(defaults, field) if override is None else override)
    for old, new, attr in _DURATIONS:
        override = getattr(options, attr)
        if override is None:
            nanos = default_duration_nanos(defaults, old, new)
        else:
            nanos = seconds_to_nanos(override)
        seconds, rest = divmod(nanos, _NANOS)
        getattr(out, new).CopyFrom(duration_pb2.Duration(seconds=seconds, nanos=rest))
        if old is not None:
            getattr(out, old).CopyFrom(meta_v1_pb2.Duration(duration=nanos))
    return pb.NodeGroupAutoscalingOptionsResponse(nodeGroupAutoscalingOptions=out)
