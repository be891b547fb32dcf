"""The config file as a JSON Schema (draft-07), built from the loader's own definitions.

The key tables (`TOP_KEYS`, `GROUP_KEYS`, ...), the bounds (`INT32_MAX`, `MIN_VOLUME_GB`, ...),
the value grammars (`values.DNS_LABEL`, `values.DURATION_SEGMENT`, ...) and the reserved names
come from the modules that enforce them; this module only says them in JSON Schema. The Helm
chart's `values.schema.json` embeds the result (`tools/genschema.py` writes it; a test holds the
committed file to it), so `helm install` refuses a value `serve` would refuse, before a Pod
crash-loops on it.

A schema says what one value may be; some rules relate values to each other or to the world
(minSize <= maxSize, a price for every group's flavor, a label the kubelet also sets, a file in
the Pod). `CROSS_FIELD_RULES` names those; the chart checks the first ones in its templates and
docs/deployment.md lists the rest. Where the schema is looser than the loader (a price string
above 1000000, a duration beyond 292 years) the provider still refuses the value at start.
"""

from __future__ import annotations

from typing import Any

from cloudscale_autoscaler.config.groups import (
    GROUP_KEYS,
    INT32_MAX,
    MAX_VOLUME_GB,
    MIN_VOLUME_GB,
    OPTION_KEYS,
    RESERVED_TAGS,
    TAINT_KEYS,
)
from cloudscale_autoscaler.config.interfaces import ENTRY_KEYS
from cloudscale_autoscaler.config.kubelet import (
    BLOCK_KEYS,
    EVICTION_SIGNALS,
    MAX_PODS_MAX,
    RESERVED_RESOURCES,
)
from cloudscale_autoscaler.config.kubernetes import KUBERNETES_KEYS, LEADER_ELECTION_KEYS
from cloudscale_autoscaler.config.loader import (
    CLOUDSCALE_KEYS,
    METRICS_KEYS,
    TLS_KEYS,
    TOP_KEYS,
)
from cloudscale_autoscaler.config.pricing import CURRENCY, MAX_PRICE, PRICING_KEYS
from cloudscale_autoscaler.config.values import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    DURATION_SEGMENT,
    LABEL_NAME_MAX,
    SUBDOMAIN_MAX,
    TAINT_EFFECTS,
    UUID,
)
from cloudscale_autoscaler.settings.types import PUBLIC_NETWORK

# The rules of template/labels.py on which keys the kubelet sets itself or refuses.
from cloudscale_autoscaler.template.labels import (
    _KUBELET_ALLOWED,
    _KUBELET_NAMESPACES,
    _RESERVED_NAMESPACES,
)

Schema = dict[str, Any]

# Rules between values, or about the world, that no per-value schema states.
CROSS_FIELD_RULES = (
    "nodeGroups[].maxSize >= minSize",
    "node group names, <name>-<zone> of `zones` included, used once",
    'cluster and group name together at most 53 characters, counting the "-<zone>" that '
    "zones add to the group name (server names are host names)",
    "a pricing.flavorsPerHour entry for every group's flavor",
    "kubernetes.leaderElection: leaseDuration > renewDeadline > 1.2 x retryPeriod",
)


def full(pattern: str) -> str:
    """`pattern` matching a whole string, as the loader's fullmatch does."""
    return f"^(?:{pattern})$"


# --- values ----------------------------------------------------------------------------------

_BLANK = r"[ \t\n\r]*"  # what str.strip() removes before a duration or a price is read
_UNITS_ZERO = r"(0+(\.0*)?|\.0+)(ns|us|µs|μs|ms|s|m|h)"
NONNEGATIVE_DURATION = f"{_BLANK}[+]?(0|({DURATION_SEGMENT})+){_BLANK}"
ZERO_DURATION = f"{_BLANK}[+-]?(0|({_UNITS_ZERO})+){_BLANK}"
# A label name part (or value) of at most 63 characters.
BOUNDED_LABEL_NAME = f"[A-Za-z0-9]([-A-Za-z0-9_.]{{0,{LABEL_NAME_MAX - 2}}}[A-Za-z0-9])?"
QUALIFIED_NAME = f"({DNS_SUBDOMAIN}/)?{BOUNDED_LABEL_NAME}"
LABEL_VALUE = f"({BOUNDED_LABEL_NAME})?"
QUANTITY = r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"
PERCENT_BELOW_100 = r"0*([0-9]{1,2}(\.[0-9]*)?|\.[0-9]+)%"
PERCENT_UP_TO_100 = r"0*(100(\.0*)?|[0-9]{1,2}(\.[0-9]*)?|\.[0-9]+)%"
PRICE_TEXT = rf"{_BLANK}[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?{_BLANK}"
HOST_PORT = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):[0-9]{1,5}"
NOT_BLANK = r"[^ \t\n\r]"


def _namespace(namespaces: tuple[str, ...]) -> str:
    """Keys whose prefix is one of `namespaces` or a subdomain of one."""
    names = "|".join(name.replace(".", r"\.") for name in namespaces)
    return rf"^([^/]*\.)?({names})/"


def _string(pattern: str | None = None, **more: Any) -> Schema:
    schema: Schema = {"type": "string"}
    if pattern is not None:
        schema["pattern"] = full(pattern)
    return {**schema, **more}


def _nonblank() -> Schema:
    return {"type": "string", "pattern": NOT_BLANK}


def duration(*, positive: bool = False) -> Schema:
    """A Go duration string that is not negative (every config duration), or a bare 0 where
    zero is allowed."""
    text = _string(NONNEGATIVE_DURATION)
    if not positive:
        return {"anyOf": [text, {"type": "integer", "const": 0}]}
    return {**text, "not": {"pattern": full(ZERO_DURATION)}}


def dns_label() -> Schema:
    return _string(DNS_LABEL, maxLength=LABEL_NAME_MAX)


def dns_subdomain() -> Schema:
    return _string(DNS_SUBDOMAIN, maxLength=SUBDOMAIN_MAX)


def qualified_name() -> Schema:
    return _string(QUALIFIED_NAME, maxLength=SUBDOMAIN_MAX + 1 + LABEL_NAME_MAX)


def _kubelet_refuses() -> Schema:
    """Keys the kubelet refuses in --node-labels (template/labels.py, self_set_error)."""
    return {
        "allOf": [
            {"pattern": _namespace(_RESERVED_NAMESPACES)},
            {"not": {"pattern": _namespace(_KUBELET_NAMESPACES)}},
            {"not": {"enum": sorted(_KUBELET_ALLOWED)}},
        ]
    }


def label_key() -> Schema:
    return {**qualified_name(), "not": _kubelet_refuses()}


def gpu_label() -> Schema:
    """A key of our own: neither one the kubelet or the CCM sets, nor one the kubelet refuses."""
    return {
        **qualified_name(),
        "not": {"anyOf": [{"enum": sorted(_KUBELET_ALLOWED)}, _kubelet_refuses()]},
    }


def percent(*, up_to_100: bool) -> Schema:
    return _string(PERCENT_UP_TO_100 if up_to_100 else PERCENT_BELOW_100)


def price() -> Schema:
    return {
        "anyOf": [
            {"type": "number", "minimum": 0, "maximum": int(MAX_PRICE)},
            _string(PRICE_TEXT),
        ]
    }


def _quantity_map(names: tuple[str, ...], value: Schema) -> Schema:
    return {
        "type": "object",
        "propertyNames": {"enum": list(names)},
        "additionalProperties": value,
    }


def _nonnegative_quantity() -> Schema:
    return {"anyOf": [{"type": "number", "minimum": 0}, _string(QUANTITY)]}


def _object(keys: tuple[str, ...], properties: Schema, **more: Any) -> Schema:
    """A mapping with exactly the loader's keys (a key missing here is a bug: KeyError)."""
    missing = [key for key in keys if key not in properties]
    extra = [key for key in properties if key not in keys]
    if missing or extra:
        raise KeyError(f"schema and loader disagree on keys: missing {missing}, extra {extra}")
    return {
        "type": "object",
        "additionalProperties": False,
        **more,
        "properties": {key: properties[key] for key in keys},
    }


def _strings(item: Schema | None = None, **more: Any) -> Schema:
    return {"type": "array", "items": item or {"type": "string"}, **more}


# --- sections -------------------------------------------------------------------------------


def _tls() -> Schema:
    return _object(
        TLS_KEYS,
        {
            "cert": _nonblank(),
            "key": _nonblank(),
            "clientCA": _nonblank(),
            "allowedClients": _strings(),
            "insecure": {"type": "boolean"},
        },
    )


def _cloudscale() -> Schema:
    return _object(
        CLOUDSCALE_KEYS,
        {
            "url": _string(r"https?://[^/?#]+([/?#].*)?"),
            "tokenFile": _nonblank(),
            "timeoutSeconds": {"type": "number", "exclusiveMinimum": 0},
            "maxConcurrentCreates": {"type": "integer", "minimum": 1},
            "requestsPerSecond": {"type": "number", "exclusiveMinimum": 0},
            "flavorCacheSeconds": {"type": "number", "minimum": 0},
        },
    )


def _pricing() -> Schema:
    return _object(
        PRICING_KEYS,
        {
            "currency": _string(CURRENCY),
            "flavorsPerHour": {
                "type": "object",
                "propertyNames": {"minLength": 1},
                "additionalProperties": price(),
            },
            "volumePerGBHour": price(),
        },
        required=list(PRICING_KEYS),
    )


def leader_election() -> Schema:
    return _object(
        LEADER_ELECTION_KEYS,
        {
            "enabled": {"type": "boolean"},
            "leaseName": dns_label(),
            "namespace": dns_label(),
            "leaseDuration": duration(positive=True),
            "renewDeadline": duration(positive=True),
            "retryPeriod": duration(positive=True),
            "journalConfigMap": dns_subdomain(),
            "endpointSlice": dns_subdomain(),
        },
    )


def kubernetes() -> Schema:
    return _object(
        KUBERNETES_KEYS,
        {
            "kubeconfig": _nonblank(),
            "driftInterval": duration(),
            "driftTolerance": percent(up_to_100=False),
            "leaderElection": leader_election(),
        },
    )


def _interface() -> Schema:
    private = _object(
        ENTRY_KEYS,
        {"network": _nonblank(), "subnet": _string(UUID)},
        required=["network"],
    )
    # `{network: public}` is the public network; it has no subnet to choose.
    private["if"] = {"properties": {"network": {"const": PUBLIC_NETWORK}}}
    private["then"] = {"not": {"required": ["subnet"]}}
    return {"anyOf": [{"const": PUBLIC_NETWORK}, private]}


def _taint() -> Schema:
    effects = "|".join(TAINT_EFFECTS)
    written = _string(f"{QUALIFIED_NAME}(={LABEL_VALUE})?:({effects})")
    mapping = _object(
        TAINT_KEYS,
        {
            "key": qualified_name(),
            "value": _string(LABEL_VALUE),
            "effect": {"enum": [*TAINT_EFFECTS]},
        },
        required=["key", "effect"],
    )
    return {"anyOf": [written, mapping]}


def _kubelet() -> Schema:
    thresholds = {"anyOf": [{"type": "number", "minimum": 0}, _string(QUANTITY),
                            percent(up_to_100=True)]}  # fmt: skip
    return _object(
        BLOCK_KEYS,
        {
            "maxPods": {"type": "integer", "minimum": 1, "maximum": MAX_PODS_MAX},
            "systemReserved": _quantity_map(RESERVED_RESOURCES, _nonnegative_quantity()),
            "kubeReserved": _quantity_map(RESERVED_RESOURCES, _nonnegative_quantity()),
            "evictionHard": _quantity_map(EVICTION_SIGNALS, thresholds),
            "configFile": _nonblank(),
        },
    )


def _options() -> Schema:
    share = {"type": "number", "minimum": 0, "maximum": 1}
    return _object(
        OPTION_KEYS,
        {
            "scaleDownUtilizationThreshold": share,
            "scaleDownGpuUtilizationThreshold": share,
            "scaleDownUnneededTime": duration(),
            "scaleDownUnreadyTime": duration(),
            "maxNodeProvisionTime": duration(),
            "maxNodeStartupTime": duration(),
            "zeroOrMaxNodeScaling": {"type": "boolean"},
            "ignoreDaemonSetsUtilization": {"type": "boolean"},
            "allowNonAtomicScaleUpToMax": {"type": "boolean"},
        },
    )


def _labels() -> Schema:
    return {
        "type": "object",
        "propertyNames": label_key(),
        "additionalProperties": _string(LABEL_VALUE),
    }


def node_group() -> Schema:
    group = _object(
        GROUP_KEYS,
        {
            "name": dns_label(),
            "minSize": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
            "maxSize": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
            "flavor": _nonblank(),
            "image": _nonblank(),
            "zone": _nonblank(),
            "zones": _strings(dns_label(), minItems=1, uniqueItems=True),
            "volumeSizeGB": {
                "type": "integer",
                "minimum": MIN_VOLUME_GB,
                "maximum": MAX_VOLUME_GB,
            },
            "sshKeys": _strings(),
            "serverGroups": _strings(_string(UUID)),
            "antiAffinity": {"type": "boolean"},
            "usePublicNetwork": {"type": "boolean"},
            "usePrivateNetwork": {"type": "boolean"},
            "useIPv6": {"type": "boolean"},
            "interfaces": _strings(_interface(), minItems=1),
            "userData": {
                "anyOf": [
                    {"type": "string"},
                    _object(("file",), {"file": _nonblank()}, required=["file"]),
                ]
            },
            "tags": {
                "type": "object",
                "propertyNames": {"minLength": 1, "not": {"enum": list(RESERVED_TAGS)}},
                "additionalProperties": {"type": "string"},
            },
            "labels": _labels(),
            "taints": _strings(_taint()),
            "kubelet": _kubelet(),
            "autoscalingOptions": _options(),
        },
        required=["name", "minSize", "maxSize", "flavor", "image"],
    )
    private_network = {
        "contains": {
            "type": "object",
            "not": {"properties": {"network": {"const": PUBLIC_NETWORK}}},
        }
    }
    group["allOf"] = [
        # One zone, or a list of them.
        {"not": {"required": ["zone", "zones"]}},
        # The provider's own server groups, or yours; its own in the group's zone.
        {
            "if": {"properties": {"antiAffinity": {"const": True}}, "required": ["antiAffinity"]},
            "then": {
                "not": {"required": ["serverGroups"]},
                "anyOf": [{"required": ["zone"]}, {"required": ["zones"]}],
            },
        },
        # The API refuses interfaces together with the use_*_network flags.
        {
            "if": {"required": ["interfaces"]},
            "then": {
                "not": {
                    "anyOf": [
                        {"required": ["usePublicNetwork"]},
                        {"required": ["usePrivateNetwork"]},
                    ]
                }
            },
        },
        # Networks are zonal: a private one needs the group's zone.
        {
            "if": {"properties": {"interfaces": private_network}, "required": ["interfaces"]},
            "then": {"required": ["zone"]},
        },
    ]
    return group


def config_schema() -> Schema:
    """The whole config file's schema, keys in the loader's order."""
    return _object(
        TOP_KEYS,
        {
            "cluster": dns_label(),
            "listen": _string(HOST_PORT),
            "tls": _tls(),
            "cloudscale": _cloudscale(),
            "metrics": _object(METRICS_KEYS, {"listen": _string(HOST_PORT)}),
            "gpuLabel": gpu_label(),
            "placeholderExpiry": duration(positive=True),
            "increaseSizeWait": duration(),
            "pricing": _pricing(),
            "kubernetes": kubernetes(),
            "stateDir": _nonblank(),
            "nodeGroups": _strings(node_group(), minItems=1),
        },
        required=["cluster", "nodeGroups"],
    )
