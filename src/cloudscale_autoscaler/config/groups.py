"""The `nodeGroups:` entries: sizes, server settings, labels, taints, tags, user data, options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_DELETION, TAG_GROUP, TAG_REQUEST
from cloudscale_autoscaler.config.interfaces import parse_interfaces
from cloudscale_autoscaler.config.kubelet import BLOCK_KEYS, parse_kubelet
from cloudscale_autoscaler.config.reader import (
    Fields,
    Issues,
    as_written,
    child,
    describe,
    item,
    resolve,
)
from cloudscale_autoscaler.config.values import (
    LABEL_NAME_MAX,
    TAINT_EFFECTS,
    dns_label_error,
    label_value_error,
    placeholder_errors,
    qualified_name_error,
    uuid_error,
)
from cloudscale_autoscaler.config.yamlfile import FileProblem, read_text
from cloudscale_autoscaler.settings.types import AutoscalingOptions, NodeGroupConfig, Taint
from cloudscale_autoscaler.template.labels import label_error

GROUP_KEYS = (
    "name",
    "minSize",
    "maxSize",
    "flavor",
    "image",
    "zone",
    "zones",
    "volumeSizeGB",
    "sshKeys",
    "serverGroups",
    "antiAffinity",
    "usePublicNetwork",
    "usePrivateNetwork",
    "useIPv6",
    "interfaces",
    "userData",
    "tags",
    "labels",
    "taints",
    "kubelet",
    "autoscalingOptions",
)
OPTION_KEYS = (
    "scaleDownUtilizationThreshold",
    "scaleDownGpuUtilizationThreshold",
    "scaleDownUnneededTime",
    "scaleDownUnreadyTime",
    "maxNodeProvisionTime",
    "maxNodeStartupTime",
    "zeroOrMaxNodeScaling",
    "ignoreDaemonSetsUtilization",
    "allowNonAtomicScaleUpToMax",
)
TAINT_KEYS = ("key", "value", "effect")
RESERVED_TAGS = (TAG_CLUSTER, TAG_GROUP, TAG_REQUEST, TAG_DELETION)
MIN_VOLUME_GB = 10  # the cloudscale.ch API's minimum root volume
# The API documents no maximum. The template's ephemeral-storage capacity is the volume in
# bytes (GiB), and a Kubernetes quantity holds at most 2^63-1 of them.
MAX_VOLUME_GB = (2**63 - 1) // 2**30
INT32_MAX = 2**31 - 1  # sizes travel as int32 in the externalgrpc protocol

T = TypeVar("T")


# A group's optional fields default to the dataclass's defaults, the one place they are set.
DEFAULTS = NodeGroupConfig


def parse_group(fields: Fields, base_dir: Path) -> list[NodeGroupConfig]:
    """The node groups of one `nodeGroups` entry: itself, or with `zones` one per zone, named
    `<name>-<zone>`, each with the entry's sizes."""
    zones = _zones(fields)
    if not zones:
        return [_parse_one(fields, base_dir, fields.string("zone"))]
    groups = [
        replace(group, name=f"{group.name}-{zone}", pool=group.name)
        for zone in zones
        if (group := _parse_one(fields, base_dir, zone))
    ]
    limit = LABEL_NAME_MAX - 1 - max(len(zone) for zone in zones)
    for group in groups:
        # The name alone may fit; with "-<zone>" it must too (names and tags are labels).
        if group.pool and dns_label_error(group.pool) is None and len(group.name) > limit + 1:
            fields.issues.add(
                fields.at("name"),
                f'with zones it makes node group "{group.name}", {len(group.name)} characters, '
                f"more than the {LABEL_NAME_MAX} a name may have; shorten the name to at most "
                f"{limit} characters",
            )
    return groups


def _zones(fields: Fields) -> tuple[str, ...]:
    if not fields.present("zones"):
        return ()
    at = fields.at("zones")
    zones = fields.strings("zones")
    if fields.present("zone"):
        fields.issues.add(at, "zone and zones exclude each other: give one zone, or a list")
    elif fields.raw("zones") == []:
        fields.issues.add(at, "must list at least one zone")
    for index, zone in enumerate(zones):
        if zone in zones[:index]:
            fields.issues.add(item(at, index), f'"{zone}" is listed twice')
        else:
            fields.issues.check(item(at, index), dns_label_error(zone))
    return tuple(dict.fromkeys(zones))


def _parse_one(fields: Fields, base_dir: Path, zone: str | None) -> NodeGroupConfig:
    name = fields.string("name", required=True)
    if name is not None:
        fields.issues.check(fields.at("name"), dns_label_error(name))
    min_size, max_size = _sizes(fields)
    flavor = fields.string("flavor", required=True) or ""
    image = fields.string("image", required=True) or ""
    return NodeGroupConfig(
        name=name or "",
        min_size=min_size,
        max_size=max_size,
        flavor=flavor,
        image=image,
        zone=zone,
        volume_size_gb=_or(
            fields.integer("volumeSizeGB", minimum=MIN_VOLUME_GB, maximum=MAX_VOLUME_GB),
            DEFAULTS.volume_size_gb,
        ),
        ssh_keys=fields.strings("sshKeys"),
        server_groups=_server_groups(fields),
        anti_affinity=_anti_affinity(fields, zone),
        use_public_network=_or(fields.boolean("usePublicNetwork"), DEFAULTS.use_public_network),
        use_private_network=_or(fields.boolean("usePrivateNetwork"), DEFAULTS.use_private_network),
        use_ipv6=_or(fields.boolean("useIPv6"), DEFAULTS.use_ipv6),
        interfaces=parse_interfaces(fields),
        user_data=_user_data(fields, base_dir),
        tags=_tags(fields),
        labels=_labels(fields, flavor, zone),
        taints=_taints(fields),
        kubelet=parse_kubelet(fields.section("kubelet", BLOCK_KEYS), base_dir),
        autoscaling_options=_options(fields) if fields.present("autoscalingOptions") else None,
    )


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def _sizes(fields: Fields) -> tuple[int, int]:
    min_size = fields.integer("minSize", required=True, minimum=0)
    max_size = fields.integer("maxSize", required=True, minimum=0, maximum=INT32_MAX)
    if min_size is not None and max_size is not None and max_size < min_size:
        fields.issues.add(fields.at("maxSize"), f"must be >= minSize ({min_size})")
    return _or(min_size, 0), _or(max_size, 0)


def _server_groups(fields: Fields) -> tuple[str, ...]:
    uuids = fields.strings("serverGroups")
    for index, value in enumerate(uuids):
        fields.issues.check(item(fields.at("serverGroups"), index), uuid_error(value))
    if uuids and fields.present("zones"):
        fields.issues.add(
            fields.at("serverGroups"),
            "cannot be combined with zones: a server group is in one zone, so every create "
            "in the others would be refused; use antiAffinity (the provider makes server "
            "groups in each zone), or one group per zone with zone and its serverGroups",
        )
    return uuids


def _anti_affinity(fields: Fields, zone: str | None) -> bool:
    managed = fields.boolean("antiAffinity") or False
    if managed and zone is None and not fields.present("zones"):
        fields.issues.add(
            fields.at("antiAffinity"),
            "needs zone (or zones): server groups are zonal, and the provider makes them in "
            "the group's zone",
        )
    if managed and fields.present("serverGroups"):
        fields.issues.add(
            fields.at("antiAffinity"),
            "antiAffinity and serverGroups exclude each other: with antiAffinity the provider "
            "makes and fills the server groups itself; with serverGroups you name your own",
        )
    return managed


def _user_data(fields: Fields, base_dir: Path) -> str | None:
    raw = fields.raw("userData")
    if raw is None:
        return None
    path = fields.at("userData")
    where = path
    if isinstance(raw, str):
        text = raw
    elif isinstance(raw, dict):
        source = Fields(fields.issues, path, raw, ("file",))
        written = source.string("file", required=True)
        if written is None:
            return None
        try:
            text = read_text(resolve(base_dir, written))
        except FileProblem as problem:
            fields.issues.add(source.at("file"), str(problem))
            return None
        where = f"{path}({written})"
    else:
        fields.issues.add(path, f"expected a string or {{file: PATH}}, got {describe(raw)}")
        return None
    for reason in placeholder_errors(text):
        fields.issues.add(where, reason)
    return text


def _checked_map(
    fields: Fields, key: str, check: Callable[[str, str], str | None]
) -> tuple[tuple[str, str], ...]:
    """A string map whose entries pass `check(name, value)`, sorted by name."""
    entries = fields.string_map(key)
    path = fields.at(key)
    good = {n: v for n, v in entries.items() if fields.issues.check(child(path, n), check(n, v))}
    return tuple(sorted(good.items()))


def _label_error(name: str, value: str) -> str | None:
    return qualified_name_error(name) or label_value_error(value)


def _tag_error(name: str, _value: str) -> str | None:
    if name in RESERVED_TAGS:
        return "reserved: the autoscaler sets this tag itself"
    return "must not be empty" if not name else None


def _labels(fields: Fields, flavor: str, zone: str | None) -> tuple[tuple[str, str], ...]:
    def check(name: str, value: str) -> str | None:
        return _label_error(name, value) or label_error(name, value, flavor, zone)

    return _checked_map(fields, "labels", check)


def _tags(fields: Fields) -> tuple[tuple[str, str], ...]:
    return _checked_map(fields, "tags", _tag_error)


def _taints(fields: Fields) -> tuple[Taint, ...]:
    taints: list[Taint] = []
    first_at: dict[tuple[str, str], int] = {}
    for index, raw in enumerate(fields.sequence("taints") or []):
        path = item(fields.at("taints"), index)
        taint = _taint(fields.issues, path, raw)
        if taint is None:
            continue
        # Kubernetes refuses two taints with the same key and effect on one node.
        identity = (taint.key, taint.effect)
        if identity in first_at:
            fields.issues.add(
                path,
                f"duplicate of taints[{first_at[identity]}] (same key and effect)",
            )
            continue
        first_at[identity] = index
        taints.append(taint)
    return tuple(taints)


def parse_taint_string(text: str) -> tuple[str, str, str]:
    """`key=value:Effect` or `key:Effect` as (key, value, effect); ValueError if neither."""
    rest, colon, effect = text.rpartition(":")
    if not colon:
        raise ValueError(f'invalid taint "{text}": expected key=value:Effect or key:Effect')
    key, _, value = rest.partition("=")
    return key, value, effect


def _taint(issues: Issues, path: str, raw: Any) -> Taint | None:
    if isinstance(raw, str):
        return _taint_from_string(issues, path, raw)
    if isinstance(raw, dict):
        return _taint_from_mapping(Fields(issues, path, raw, TAINT_KEYS))
    issues.add(path, f"expected a mapping or a string key=value:Effect, got {describe(raw)}")
    return None


def _taint_from_string(issues: Issues, path: str, text: str) -> Taint | None:
    try:
        key, value, effect = parse_taint_string(text)
    except ValueError as exc:
        issues.add(path, str(exc))
        return None
    reasons = [qualified_name_error(key), label_value_error(value), _effect_error(effect)]
    problems = [reason for reason in reasons if reason is not None]
    for reason in problems:
        issues.add(path, reason)
    return None if problems else Taint(key, value, effect)


def _taint_from_mapping(fields: Fields) -> Taint | None:
    key = fields.string("key", required=True)
    value = fields.string("value", nonempty=False) or ""
    effect = fields.string("effect", required=True)
    ok = key is not None and fields.issues.check(fields.at("key"), qualified_name_error(key))
    ok = fields.issues.check(fields.at("value"), label_value_error(value)) and ok
    ok = (
        effect is not None and fields.issues.check(fields.at("effect"), _effect_error(effect))
    ) and ok
    if not ok or key is None or effect is None:
        return None
    return Taint(key, value, effect)


def _effect_error(effect: str) -> str | None:
    if effect in TAINT_EFFECTS:
        return None
    return f'invalid effect "{effect}": expected one of {", ".join(TAINT_EFFECTS)}'


def _threshold(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else f"must be between 0 and 1, got {value:g}"


def _duration(fields: Fields, key: str) -> float | None:
    seconds = fields.duration(key, example="10m")
    if seconds is not None and seconds < 0:
        written = as_written(fields.raw(key))
        fields.issues.add(fields.at(key), f"must not be negative, got {written}")
        return None
    return seconds


def _options(group: Fields) -> AutoscalingOptions:
    fields = group.section("autoscalingOptions", OPTION_KEYS)
    return AutoscalingOptions(
        scale_down_utilization_threshold=fields.number("scaleDownUtilizationThreshold", _threshold),
        scale_down_gpu_utilization_threshold=fields.number(
            "scaleDownGpuUtilizationThreshold", _threshold
        ),
        scale_down_unneeded_seconds=_duration(fields, "scaleDownUnneededTime"),
        scale_down_unready_seconds=_duration(fields, "scaleDownUnreadyTime"),
        max_node_provision_seconds=_duration(fields, "maxNodeProvisionTime"),
        max_node_startup_seconds=_duration(fields, "maxNodeStartupTime"),
        zero_or_max_node_scaling=fields.boolean("zeroOrMaxNodeScaling"),
        ignore_daemonsets_utilization=fields.boolean("ignoreDaemonSetsUtilization"),
        allow_non_atomic_scale_up_to_max=fields.boolean("allowNonAtomicScaleUpToMax"),
    )
