"""Pure value checks used by the config loader: names, addresses, durations, quantities.

Each `*_error` function returns the reason a value is invalid, or None when it is fine, so the
loader can prefix the reason with the value's path and keep collecting. Parsers raise
ValueError with the reason instead.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Iterable
from fractions import Fraction
from urllib.parse import urlsplit

from cloudscale_autoscaler.observability.echo import clip
from cloudscale_autoscaler.template.quantity import parse_percent, parse_quantity
from cloudscale_autoscaler.template.userdata import PLACEHOLDERS

# The value grammars, as regular expressions both Python and the chart's JSON Schema
# (config/schema.py; Go's RE2 in helm) read the same way.
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = rf"{DNS_LABEL}(\.{DNS_LABEL})*"
# The name part of a qualified name and a label value share one character set.
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_DNS_LABEL = re.compile(DNS_LABEL)
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN)
_LABEL_NAME = re.compile(LABEL_NAME)
_HOSTNAME = re.compile(
    r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*"
)
_UUID = re.compile(UUID)

LABEL_NAME_MAX = 63
# The random part of a server name (`<cluster>-<group>-<suffix>`): the config checks that the
# whole fits a host name, the engine makes the names.
SUFFIX_LENGTH = 8
SUBDOMAIN_MAX = 253
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_NAME_CHARSET = "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"


def dns_label_error(value: str) -> str | None:
    """RFC 1123 label: what Kubernetes and host names accept for one name segment."""
    if len(value) > LABEL_NAME_MAX:
        return f"must be at most {LABEL_NAME_MAX} characters, got {len(value)}"
    if not _DNS_LABEL.fullmatch(value):
        return (
            f'invalid name "{value}": expected a DNS-1123 label (lowercase letters, digits '
            "and '-', starting and ending with a letter or digit)"
        )
    return None


def dns_subdomain_error(value: str) -> str | None:
    """RFC 1123 subdomain: what Kubernetes accepts as the name of most objects (ConfigMaps,
    EndpointSlices): dot-separated labels, at most 253 characters."""
    if len(value) > SUBDOMAIN_MAX:
        return f"must be at most {SUBDOMAIN_MAX} characters, got {len(value)}"
    if not all(_DNS_LABEL.fullmatch(part) for part in value.split(".")):
        return (
            f'invalid name "{value}": expected a DNS-1123 subdomain (lowercase letters, digits, '
            "'-' and '.', starting and ending with a letter or digit)"
        )
    return None


def qualified_name_error(value: str) -> str | None:
    """A Kubernetes label/taint key: `[prefix/]name`, prefix a DNS subdomain."""
    prefix, slash, name = value.rpartition("/")
    bad_prefix = not prefix or len(prefix) > SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.fullmatch(prefix)
    if slash and bad_prefix:
        return (
            f'invalid key "{value}": prefix "{prefix}" must be a lowercase DNS subdomain '
            f"of at most {SUBDOMAIN_MAX} characters"
        )
    if not name:
        return f'invalid key "{value}": the name part must not be empty'
    if len(name) > LABEL_NAME_MAX:
        return f'invalid key "{value}": the name part must be at most {LABEL_NAME_MAX} characters'
    if not _LABEL_NAME.fullmatch(name):
        return f'invalid key "{value}": the name part must consist of {_NAME_CHARSET}'
    return None


def label_value_error(value: str) -> str | None:
    """A Kubernetes label value (also a taint value): may be empty."""
    if len(value) > LABEL_NAME_MAX:
        return f'invalid value "{value}": must be at most {LABEL_NAME_MAX} characters'
    if value and not _LABEL_NAME.fullmatch(value):
        return f'invalid value "{value}": must be empty or consist of {_NAME_CHARSET}'
    return None


def uuid_error(value: str) -> str | None:
    if not _UUID.fullmatch(value):
        return f'invalid UUID "{value}": expected the form 01234567-89ab-cdef-0123-456789abcdef'
    return None


def http_url_error(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f'invalid URL "{value}": expected an http:// or https:// URL with a host'
    return None


def parse_host_port(value: str) -> tuple[str, int]:
    """`host:port` with an IPv4 address, a host name or a bracketed IPv6 address as host."""
    host, colon, port_text = value.rpartition(":")
    if not colon or not host:
        raise ValueError(f'invalid address "{value}": expected host:port such as 0.0.0.0:8086')
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f'invalid address "{value}": port must be a number from 1 to 65535')
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(
                f'invalid address "{value}": "{host}" is not an IPv6 address'
            ) from None
    elif not _HOSTNAME.fullmatch(host):
        raise ValueError(
            f'invalid address "{value}": host must be an IP address, a host name, '
            "or an IPv6 address in brackets"
        )
    elif all(label.isdigit() for label in host.split(".")):
        # No host name is all digits (RFC 1123: the top-level label is not numeric).
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(
                f'invalid address "{value}": "{host}" is not an IPv4 address'
            ) from None
    return host, int(port_text)


# Go's time.ParseDuration units, in seconds.
_DURATION_UNITS = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),  # U+00B5 micro sign
    "μs": Fraction(1, 10**6),  # U+03BC greek mu
    "ms": Fraction(1, 10**3),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
# Go's time.Duration is an int64 of nanoseconds: about ±292 years. CA parses our durations
# into one (and the externalgrpc protos carry them as such).
_GO_DURATION_MAX_NS = 2**63 - 1
# One number and its unit; ASCII digits only, as Go reads them.
DURATION_SEGMENT = r"([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)"
_DURATION_SEGMENT = re.compile(DURATION_SEGMENT)


def parse_go_duration(value: str) -> float:
    """A Go duration string ("1h30m", "90s", "500ms", "0") as seconds."""
    text = value.strip()
    sign = -1 if text.startswith("-") else 1
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    total = Fraction(0)
    pos = 0
    while pos < len(body):
        match = _DURATION_SEGMENT.match(body, pos)
        if match is None:
            break
        try:
            total += Fraction(match.group(1)) * _DURATION_UNITS[match.group(3)]
        except ValueError:  # more digits than Python converts: far beyond the range anyway
            raise ValueError(_beyond_go_duration(value)) from None
        pos = match.end()
    if not body or pos != len(body):
        raise ValueError(
            f'invalid duration "{value}": expected a Go duration such as 90s, 10m or 1h30m'
        )
    nanoseconds = sign * total * 10**9
    if not -_GO_DURATION_MAX_NS - 1 <= nanoseconds <= _GO_DURATION_MAX_NS:
        raise ValueError(_beyond_go_duration(value))
    return float(sign * total)


def _beyond_go_duration(value: str) -> str:
    return (
        f'invalid duration "{clip(value)}": beyond the about 292 years (2^63-1 ns) a Go '
        "duration can hold"
    )


def nonnegative_quantity_error(value: str) -> str | None:
    try:
        amount = parse_quantity(value)
    except ValueError:
        return f'invalid quantity "{value}": expected a Kubernetes quantity such as 512Mi'
    return f'invalid quantity "{value}": must not be negative' if amount < 0 else None


def threshold_error(value: str) -> str | None:
    """An eviction threshold: a non-negative quantity or a percentage from 0% to 100%."""
    if value.endswith("%"):
        try:
            percent = parse_percent(value)
        except ValueError as exc:
            return str(exc)
        if percent > 100:
            return f'invalid percentage "{value}": must be between 0% and 100%'
        return None
    try:
        amount = parse_quantity(value)
    except ValueError:
        return (
            f'invalid threshold "{value}": expected a quantity such as 100Mi '
            "or a percentage such as 10%"
        )
    return f'invalid quantity "{value}": must not be negative' if amount < 0 else None


def did_you_mean(key: str, allowed: Iterable[str]) -> str | None:
    """The closest allowed spelling, compared case-insensitively (so minsize finds minSize)."""
    by_folded = {_fold(name): name for name in allowed}
    folded = _fold(key)
    if folded in by_folded:
        return by_folded[folded]
    close = difflib.get_close_matches(folded, list(by_folded), n=1)
    return by_folded[close[0]] if close else None


def _fold(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def unknown_key_reason(key: str, allowed: Iterable[str]) -> str:
    names = list(allowed)
    guess = did_you_mean(key, names)
    if guess is not None:
        return f'unknown key; did you mean "{guess}"?'
    return "unknown key; expected one of: " + ", ".join(names)


# `$${` (escape) or `${name}`; a `${` without a `}` on the same line is unterminated. The engine
# renders with the same grammar (template/userdata.py); checking here reports every problem, with
# its line, before any server boots with a half-filled template.
_PLACEHOLDER = re.compile(r"\$\$\{|\$\{([^}\n]*)(\})?")
_ALLOWED_PLACEHOLDERS = ", ".join(f"${{{name}}}" for name in sorted(PLACEHOLDERS))


def placeholder_errors(text: str) -> list[str]:
    """Reasons for every placeholder other than the allowed `${name}`s, each naming its line."""
    reasons: list[str] = []
    for match in _PLACEHOLDER.finditer(text):
        if match.group(0) == "$${":
            continue
        line = text.count("\n", 0, match.start()) + 1
        name = match.group(1)
        if match.group(2) is None:
            reasons.append(f'line {line}: unterminated placeholder "${{{name}": missing "}}"')
        elif name not in PLACEHOLDERS:
            reasons.append(
                f"line {line}: unknown placeholder ${{{name}}}; allowed: {_ALLOWED_PLACEHOLDERS}"
                " (write $${ for a literal ${)"
            )
    return reasons
