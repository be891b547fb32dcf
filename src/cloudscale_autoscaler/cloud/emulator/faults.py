"""The fault set (the body of PUT /_emulator/faults): parsing, serialising and drawing.

Every random decision draws from the one RNG the caller passes (seeded with --seed), so the same
seed, fault set and request sequence give the same outcomes. Per-endpoint settings fall back to
the "*" entry when an endpoint has none of its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

ENDPOINTS: frozenset[str] = frozenset(
    {
        "list_servers",
        "get_server",
        "create_server",
        "delete_server",
        "patch_server",
        "list_flavors",
        "list_images",
        "list_regions",
        "list_server_groups",
        "create_server_group",
        "get_server_group",
        "patch_server_group",
        "delete_server_group",
        "list_networks",
        "list_subnets",
        "*",
    }
)
CREATE_FAILURE_KINDS: frozenset[str] = frozenset({"quota", "capacity", "server_error", "invalid"})
LOST_RESPONSE_MODES: frozenset[str] = frozenset({"drop", "504"})
# Whose creates lose_create_responses hits (one of them; servers unless it says otherwise).
LOSABLE_CREATES: frozenset[str] = frozenset({"create_server", "create_server_group"})
DOWN_MODES: frozenset[str] = frozenset({"503", "reset"})
_TOP_LEVEL = frozenset(
    {
        "latency",
        "error_rate",
        "rate_limit",
        "quota",
        "fail_next_creates",
        "fail_next_deletes",
        "zones_out_of_capacity",
        "host_shortage",
        "lose_create_responses",
        "slow_deletes_seconds",
        "down",
    }
)


class FaultsError(ValueError):
    """A bad fault body; `path` names the offending key, e.g. "error_rate.get_server.rate"."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


@dataclass(frozen=True, slots=True)
class Latency:
    fixed_ms: float = 0.0
    jitter_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class ErrorRate:
    rate: float
    status: int = 503


@dataclass(frozen=True, slots=True)
class RateLimit:
    rate: float
    retry_after: int = 1


@dataclass(frozen=True, slots=True)
class Quota:
    max_servers: int | None = None
    max_vcpus: int | None = None


@dataclass(slots=True)
class Countdown:
    """A fault that hits the next `count` matching requests; `what` is the kind or mode,
    `endpoint` the create it hits (lose_create_responses)."""

    count: int
    what: str
    endpoint: str = "create_server"

    def take(self) -> str | None:
        if self.count <= 0:
            return None
        self.count -= 1
        return self.what


@dataclass(slots=True)
class DeleteFailures:
    """The next `count` deletes of an existing server answer `status` and delete nothing."""

    count: int
    status: int = 500

    def take(self) -> int | None:
        if self.count <= 0:
            return None
        self.count -= 1
        return self.status


@dataclass(slots=True)
class HostShortage:
    """No host left for one more member of a server group: server creates that name a server
    group, in `zones` (every zone when empty), are refused; with `count`, only the next
    `count` of them."""

    zones: tuple[str, ...] = ()
    count: int | None = None

    def take(self, zone: str) -> bool:
        if self.zones and zone not in self.zones:
            return False
        if self.count is None:
            return True
        if self.count <= 0:
            return False
        self.count -= 1
        return True

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.zones:
            body["zones"] = list(self.zones)
        if self.count is not None:
            body["count"] = self.count
        return body


@dataclass(slots=True)
class Faults:
    latency: dict[str, Latency] = field(default_factory=dict)
    error_rate: dict[str, ErrorRate] = field(default_factory=dict)
    rate_limit: dict[str, RateLimit] = field(default_factory=dict)
    quota: Quota | None = None
    fail_next_creates: Countdown | None = None
    fail_next_deletes: DeleteFailures | None = None
    zones_out_of_capacity: tuple[str, ...] = ()
    host_shortage: HostShortage | None = None
    lose_create_responses: Countdown | None = None
    slow_deletes_seconds: float = 0.0
    down: str | None = None  # "503" | "reset"

    # Draws: each configured per-endpoint fault draws exactly once per request.

    def latency_seconds(self, endpoint: str, rng: random.Random) -> float:
        latency = _pick(self.latency, endpoint)
        if latency is None:
            return 0.0
        jitter = rng.uniform(0.0, latency.jitter_ms) if latency.jitter_ms else 0.0
        return (latency.fixed_ms + jitter) / 1000.0

    def delays(self, endpoint: str) -> bool:
        return _pick(self.latency, endpoint) is not None

    def rate_limited(self, endpoint: str, rng: random.Random) -> RateLimit | None:
        limit = _pick(self.rate_limit, endpoint)
        return limit if limit is not None and rng.random() < limit.rate else None

    def injected_status(self, endpoint: str, rng: random.Random) -> int | None:
        error = _pick(self.error_rate, endpoint)
        return error.status if error is not None and rng.random() < error.rate else None

    def to_json(self) -> dict[str, Any]:
        """The set in the PUT body's form (counters show what is left); unset keys omitted."""
        body: dict[str, Any] = {
            name: {endpoint: asdict(spec) for endpoint, spec in table.items()}
            for name, table in (
                ("latency", self.latency),
                ("error_rate", self.error_rate),
                ("rate_limit", self.rate_limit),
            )
            if table
        }
        if self.quota:
            body["quota"] = {k: v for k, v in asdict(self.quota).items() if v is not None}
        if self.fail_next_creates:
            body["fail_next_creates"] = {
                "count": self.fail_next_creates.count,
                "kind": self.fail_next_creates.what,
            }
        if self.fail_next_deletes:
            body["fail_next_deletes"] = asdict(self.fail_next_deletes)
        if self.zones_out_of_capacity:
            body["zones_out_of_capacity"] = list(self.zones_out_of_capacity)
        if self.host_shortage is not None:
            body["host_shortage"] = self.host_shortage.to_json()
        lost = self.lose_create_responses
        if lost:
            body["lose_create_responses"] = {"count": lost.count, "mode": lost.what}
            if lost.endpoint != "create_server":
                body["lose_create_responses"]["endpoint"] = lost.endpoint
        if self.slow_deletes_seconds:
            body["slow_deletes_seconds"] = self.slow_deletes_seconds
        if self.down:
            body["down"] = True if self.down == "503" else self.down
        return body


def _pick(table: dict[str, T], endpoint: str) -> T | None:
    found = table.get(endpoint)
    return found if found is not None else table.get("*")


# ---- parsing -------------------------------------------------------------------------------


def parse_faults(body: Any, zones: tuple[str, ...]) -> Faults:
    """Validate a whole fault body; raises FaultsError naming the first bad key."""
    obj = _object(body, "faults")
    unknown = sorted(set(obj) - _TOP_LEVEL)
    if unknown:
        raise FaultsError(unknown[0], f"unknown fault; expected one of {sorted(_TOP_LEVEL)}")
    faults = Faults()
    faults.latency = _per_endpoint(obj, "latency", _latency)
    faults.error_rate = _per_endpoint(obj, "error_rate", _error_rate)
    faults.rate_limit = _per_endpoint(obj, "rate_limit", _rate_limit)
    if obj.get("quota") is not None:
        q = _object(obj["quota"], "quota", {"max_servers", "max_vcpus"})
        faults.quota = Quota(
            max_servers=_optional_int(q, "max_servers", "quota"),
            max_vcpus=_optional_int(q, "max_vcpus", "quota"),
        )
    if obj.get("fail_next_creates") is not None:
        faults.fail_next_creates = _countdown(
            obj["fail_next_creates"],
            "fail_next_creates",
            "kind",
            CREATE_FAILURE_KINDS,
            "server_error",
        )
    if obj.get("fail_next_deletes") is not None:
        failing = _object(obj["fail_next_deletes"], "fail_next_deletes", {"count", "status"})
        faults.fail_next_deletes = DeleteFailures(
            count=_integer(failing.get("count", 1), "fail_next_deletes.count", 0, None),
            status=_integer(failing.get("status", 500), "fail_next_deletes.status", 400, 599),
        )
    if obj.get("lose_create_responses") is not None:
        faults.lose_create_responses = _countdown(
            obj["lose_create_responses"],
            "lose_create_responses",
            "mode",
            LOST_RESPONSE_MODES,
            "drop",
            endpoints=LOSABLE_CREATES,
        )
    faults.zones_out_of_capacity = _zones(
        obj.get("zones_out_of_capacity"), zones, "zones_out_of_capacity"
    )
    if obj.get("host_shortage") is not None:
        shortage = _object(obj["host_shortage"], "host_shortage", {"zones", "count"})
        count = shortage.get("count")
        faults.host_shortage = HostShortage(
            zones=_zones(shortage.get("zones"), zones, "host_shortage.zones"),
            count=None if count is None else _integer(count, "host_shortage.count", 0, None),
        )
    faults.slow_deletes_seconds = _number(
        obj.get("slow_deletes_seconds", 0), "slow_deletes_seconds", 0, None
    )
    faults.down = _down(obj.get("down"))
    return faults


def _object(value: Any, path: str, keys: set[str] | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FaultsError(path, f"expected a JSON object, got {type(value).__name__}")
    if keys is not None:
        unknown = sorted(set(value) - keys)
        if unknown:
            raise FaultsError(f"{path}.{unknown[0]}", f"unknown key; expected {sorted(keys)}")
    return value


def _per_endpoint(obj: dict[str, Any], name: str, parse: Callable[[Any, str], T]) -> dict[str, T]:
    if obj.get(name) is None:
        return {}
    table = _object(obj[name], name)
    parsed: dict[str, T] = {}
    for endpoint, spec in table.items():
        path = f"{name}.{endpoint}"
        if endpoint not in ENDPOINTS:
            raise FaultsError(path, f"unknown endpoint; expected one of {sorted(ENDPOINTS)}")
        parsed[endpoint] = parse(spec, path)
    return parsed


def _latency(spec: Any, path: str) -> Latency:
    obj = _object(spec, path, {"fixed_ms", "jitter_ms"})
    return Latency(
        fixed_ms=_number(obj.get("fixed_ms", 0), f"{path}.fixed_ms", 0, None),
        jitter_ms=_number(obj.get("jitter_ms", 0), f"{path}.jitter_ms", 0, None),
    )


def _error_rate(spec: Any, path: str) -> ErrorRate:
    obj = _object(spec, path, {"rate", "status"})
    return ErrorRate(
        rate=_number(obj.get("rate"), f"{path}.rate", 0, 1),
        status=_integer(obj.get("status", 503), f"{path}.status", 400, 599),
    )


def _rate_limit(spec: Any, path: str) -> RateLimit:
    obj = _object(spec, path, {"rate", "retry_after"})
    return RateLimit(
        rate=_number(obj.get("rate"), f"{path}.rate", 0, 1),
        retry_after=_integer(obj.get("retry_after", 1), f"{path}.retry_after", 0, 3600),
    )


def _countdown(
    spec: Any,
    path: str,
    what_key: str,
    choices: frozenset[str],
    default: str,
    endpoints: frozenset[str] | None = None,
) -> Countdown:
    keys = {"count", what_key} | ({"endpoint"} if endpoints else set())
    obj = _object(spec, path, keys)
    what = obj.get(what_key, default)
    if what not in choices:
        raise FaultsError(f"{path}.{what_key}", f"got {what!r}, expected one of {sorted(choices)}")
    countdown = Countdown(count=_integer(obj.get("count", 1), f"{path}.count", 0, None), what=what)
    if endpoints:
        endpoint = obj.get("endpoint", countdown.endpoint)
        if endpoint not in endpoints:
            raise FaultsError(
                f"{path}.endpoint", f"got {endpoint!r}, expected one of {sorted(endpoints)}"
            )
        countdown.endpoint = endpoint
    return countdown


def _zones(value: Any, zones: tuple[str, ...], path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise FaultsError(path, "expected a list of zone slugs")
    for zone in value:
        if zone not in zones:
            raise FaultsError(path, f"unknown zone {zone!r}; expected one of {list(zones)}")
    return tuple(value)


def _down(value: Any) -> str | None:
    if value is None or value is False:
        return None
    if value is True:
        return "503"
    if value in DOWN_MODES:
        return str(value)
    raise FaultsError("down", f'got {value!r}, expected true, false, "503" or "reset"')


def _optional_int(obj: dict[str, Any], key: str, path: str) -> int | None:
    value = obj.get(key)
    return None if value is None else _integer(value, f"{path}.{key}", 0, None)


def _number(value: Any, path: str, low: float, high: float | None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultsError(path, f"expected a number, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f">= {low}"
        raise FaultsError(path, f"got {value}, expected a number {bounds}")
    return float(value)


def _integer(value: Any, path: str, low: int, high: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultsError(path, f"expected an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f">= {low}"
        raise FaultsError(path, f"got {value}, expected an integer {bounds}")
    return value
