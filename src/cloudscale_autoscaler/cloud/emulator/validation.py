"""Request-body validation with Django REST Framework shaped errors.

Like DRF, every field is checked and all problems are reported at once as
{"field": ["message", ...]}; unknown fields are ignored. Messages reuse DRF's standard texts
where one exists; the others are the emulator's own wording (see docs/emulator.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from cloudscale_autoscaler.cloud.emulator.catalogue import (
    DEFAULT_ZONE,
    FLAVORS,
    IMAGES,
    MAX_SERVERS_PER_GROUP,
    MIN_VOLUME_SIZE_GB,
    STATUSES,
    ZONES,
    FlavorSpec,
    ImageSpec,
)
from cloudscale_autoscaler.cloud.emulator.networks import Attached, validate_interfaces
from cloudscale_autoscaler.cloud.emulator.records import SERVER_GROUP_TYPE, ServerGroupRecord

REQUIRED = "This field is required."
NOT_NULL = "This field may not be null."
NOT_BLANK = "This field may not be blank."
NOT_BOOLEAN = "Must be a valid boolean."
NOT_STRING = "Not a valid string."
NOT_INTEGER = "A valid integer is required."

T = TypeVar("T")
MAX_POPULATE = 100_000
POPULATE_DEFAULTS = {"flavor": "flex-4-2", "image": "debian-12", "status": "running"}


class ServerGroups(Protocol):
    """The server groups a create request may name (the emulator's state)."""

    def server_group(self, uuid: str) -> ServerGroupRecord | None: ...

    def member_count(self, uuid: str) -> int: ...


def group_full_message(uuid: str) -> str:
    """A create naming a group that holds MAX_SERVERS_PER_GROUP servers already (field
    `server_groups`; the client recognises "full", see docs/emulator.md)."""
    return (
        f"Server group {uuid} is full: it already has {MAX_SERVERS_PER_GROUP} servers, "
        "the most an anti-affinity group may hold."
    )


_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class FieldErrors(Exception):
    """400 with a DRF body: {"field": ["message", ...]} (nested for `interfaces`)."""

    def __init__(self, errors: dict[str, list[Any]]) -> None:
        self.errors = errors
        super().__init__(str(errors))


def host_name_error(name: str) -> str | None:
    """RFC 1123 host name or FQDN: labels of 1-63 letters/digits/hyphens, not starting or
    ending with a hyphen, at most 253 characters in all."""
    if len(name) > 253:
        return f"Ensure this value has at most 253 characters (it has {len(name)})."
    for label in name.split("."):
        if not _LABEL.match(label):
            return (
                f"Enter a valid host name or FQDN (RFC 1123): label {label!r} of {name!r} "
                "must be 1-63 letters, digits or hyphens and not start or end with a hyphen."
            )
    return None


@dataclass
class NewServer:
    """A validated create request."""

    name: str
    flavor: FlavorSpec
    image: ImageSpec
    zone: str
    volume_size_gb: int = MIN_VOLUME_SIZE_GB
    ssh_keys: tuple[str, ...] = ()
    server_groups: tuple[ServerGroupRecord, ...] = ()
    use_public_network: bool = True
    use_private_network: bool = False
    use_ipv6: bool = True
    interfaces: tuple[Attached, ...] | None = None  # None: the use_* flags decide
    user_data: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    status: str | None = None  # admin API only


class _Checker:
    """Collects errors per field while reading one body."""

    def __init__(self, body: Any) -> None:
        if not isinstance(body, dict):
            kind = "list" if isinstance(body, list) else type(body).__name__
            raise FieldErrors(
                {"non_field_errors": [f"Invalid data. Expected a dictionary, but got {kind}."]}
            )
        self.body: dict[str, Any] = body
        self.errors: dict[str, list[Any]] = {}

    def fail(self, key: str, message: str) -> None:
        self.errors.setdefault(key, []).append(message)

    def string(self, key: str, *, required: bool = False, blank: bool = False) -> str | None:
        if key not in self.body:
            if required:
                self.fail(key, REQUIRED)
            return None
        value = self.body[key]
        if value is None:
            self.fail(key, NOT_NULL)
        elif not isinstance(value, str):
            self.fail(key, NOT_STRING)
        elif not blank and not value.strip():
            self.fail(key, NOT_BLANK)
        else:
            return value
        return None

    def slug(self, key: str, table: dict[str, T], *, required: bool) -> T | None:
        value = self.string(key, required=required)
        if value is None:
            return None
        found = table.get(value)
        if found is None:
            self.fail(key, f"Object with slug={value} does not exist.")
        return found

    def boolean(self, key: str, default: bool) -> bool:
        value = self.body.get(key, default)
        if isinstance(value, bool):
            return value
        self.fail(key, NOT_NULL if value is None else NOT_BOOLEAN)
        return default

    def integer(
        self, key: str, default: int | None, minimum: int, maximum: int | None = None
    ) -> int:
        value = self.body.get(key, default)
        if key not in self.body and default is None:
            self.fail(key, REQUIRED)
        elif value is None:
            self.fail(key, NOT_NULL)
        elif isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, NOT_INTEGER)
        elif value < minimum:
            self.fail(key, f"Ensure this value is greater than or equal to {minimum}.")
        elif maximum is not None and value > maximum:
            self.fail(key, f"Ensure this value is less than or equal to {maximum}.")
        else:
            return int(value)
        return minimum

    def zone(self) -> str:
        """The requested zone, DEFAULT_ZONE when absent, "" when invalid."""
        if "zone" not in self.body:
            return DEFAULT_ZONE
        zone = self.string("zone")
        if zone is not None and zone not in ZONES:
            self.fail("zone", f"Object with slug={zone} does not exist.")
            return ""
        return zone or ""

    def string_list(self, key: str) -> tuple[str, ...]:
        value = self.body.get(key, [])
        if value is None:
            self.fail(key, NOT_NULL)
        elif not isinstance(value, list):
            self.fail(key, f'Expected a list of items but got type "{type(value).__name__}".')
        elif not all(isinstance(item, str) for item in value):
            self.fail(key, "Expected a list of strings.")
        else:
            return tuple(value)
        return ()

    def tags(self, key: str = "tags") -> dict[str, str] | None:
        if key not in self.body:
            return None
        value = self.body[key]
        if value is None:
            self.fail(key, NOT_NULL)
        elif not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            self.fail(key, "Expected a dictionary of string keys to string values.")
        else:
            return dict(value)
        return None

    def host_name(self, key: str = "name", *, required: bool) -> str | None:
        name = self.string(key, required=required)
        problem = host_name_error(name) if name is not None else None
        if problem:
            self.fail(key, problem)
            return None
        return name

    def done(self) -> None:
        if self.errors:
            raise FieldErrors(self.errors)


def validate_create(body: Any, groups: ServerGroups, *, allow_status: bool = False) -> NewServer:
    """Check a POST /v1/servers body; `groups` resolves and counts the server groups named."""
    check = _Checker(body)
    name = check.host_name(required=True)
    flavor = check.slug("flavor", FLAVORS, required=True)
    image = check.slug("image", IMAGES, required=True)
    zone = check.zone()
    if flavor is not None and zone and zone not in flavor.zones:
        check.fail("flavor", f"Flavor {flavor.slug} is not available in zone {zone}.")
    if image is not None and zone and zone not in image.zones:
        check.fail("image", f"Image {image.slug} is not available in zone {zone}.")
    members_of = _server_groups(check, zone, groups)
    interface_errors, interfaces = validate_interfaces(check.body, zone)
    if interface_errors:
        check.errors["interfaces"] = interface_errors
    status = None
    if allow_status:
        status = check.string("status")
        if status is not None and status not in STATUSES:
            check.fail("status", f'"{status}" is not a valid choice ({sorted(STATUSES)}).')
    options: dict[str, Any] = {
        "volume_size_gb": check.integer("volume_size_gb", MIN_VOLUME_SIZE_GB, MIN_VOLUME_SIZE_GB),
        "ssh_keys": check.string_list("ssh_keys"),
        "use_public_network": check.boolean("use_public_network", True),
        "use_private_network": check.boolean("use_private_network", False),
        "use_ipv6": check.boolean("use_ipv6", True),
        "interfaces": interfaces,
        "user_data": _user_data(check),
        "tags": check.tags() or {},
    }
    check.done()
    # No errors, so every required field was found.
    assert name is not None and flavor is not None and image is not None
    return NewServer(
        name=name,
        flavor=flavor,
        image=image,
        zone=zone,
        server_groups=members_of,
        status=status,
        **options,
    )


def _user_data(check: _Checker) -> str | None:
    value = check.body.get("user_data")
    if value is None or isinstance(value, str):
        return value
    check.fail("user_data", NOT_STRING)
    return None


def _server_groups(
    check: _Checker, zone: str, groups: ServerGroups
) -> tuple[ServerGroupRecord, ...]:
    found: list[ServerGroupRecord] = []
    for ident in check.string_list("server_groups"):
        group = groups.server_group(ident)
        if group is None:
            check.fail("server_groups", f"Object with uuid={ident} does not exist.")
        elif zone and group.zone != zone:
            check.fail(
                "server_groups",
                f"Server group {ident} is in zone {group.zone}, not in zone {zone}.",
            )
        elif groups.member_count(ident) >= MAX_SERVERS_PER_GROUP:
            check.fail("server_groups", group_full_message(ident))
        else:
            found.append(group)
    return tuple(found)


def validate_populate(body: Any, groups: ServerGroups) -> tuple[int, NewServer]:
    """POST /_emulator/populate: a count plus a create body whose name is `name_prefix`
    (default "populated"), with POPULATE_DEFAULTS for flavor, image and status."""
    check = _Checker(body)
    count = check.integer("count", None, 1, MAX_POPULATE)
    if "server_groups" in check.body:
        # One validation cannot vouch for N members of a group that holds at most 4.
        check.fail("server_groups", "Not supported by populate; use POST /_emulator/servers.")
    template_body = {k: v for k, v in check.body.items() if k not in ("count", "name_prefix")}
    template_body["name"] = check.body.get("name_prefix", "populated")
    for key, default in POPULATE_DEFAULTS.items():
        template_body.setdefault(key, default)
    try:
        template = validate_create(template_body, groups, allow_status=True)
    except FieldErrors as exc:
        for key, messages in exc.errors.items():
            for message in messages:
                check.fail("name_prefix" if key == "name" else key, message)
    check.done()
    return count, template


@dataclass
class ServerPatch:
    name: str | None
    tags: dict[str, str] | None


def validate_patch(body: Any) -> ServerPatch:
    """PATCH /v1/servers/{uuid}: we support `name` and `tags` (tags replace the whole object)."""
    check = _Checker(body)
    name = check.host_name(required=False)
    tags = check.tags()
    check.done()
    return ServerPatch(name=name, tags=tags)


@dataclass
class NewServerGroup:
    """A validated POST /v1/server-groups body."""

    name: str
    zone: str
    tags: dict[str, str] = field(default_factory=dict)


def validate_server_group_create(body: Any) -> NewServerGroup:
    """POST /v1/server-groups: `name` and `type` required (only "anti-affinity"), `zone`
    (DEFAULT_ZONE when absent) and `tags` optional; other fields are ignored."""
    check = _Checker(body)
    name = check.string("name", required=True)
    kind = check.string("type", required=True)
    if kind is not None and kind != SERVER_GROUP_TYPE:
        check.fail("type", f'"{kind}" is not a valid choice.')
    zone = check.zone()
    tags = check.tags() or {}
    check.done()
    assert name is not None  # no errors, so it was found
    return NewServerGroup(name=name, zone=zone, tags=tags)


@dataclass
class ServerGroupPatch:
    name: str | None
    tags: dict[str, str] | None


def validate_server_group_patch(body: Any) -> ServerGroupPatch:
    """PATCH /v1/server-groups/{uuid}: `name` and `tags` (replacing the whole object); the
    type and the zone cannot change, those and other fields are ignored."""
    check = _Checker(body)
    name = check.string("name")
    tags = check.tags()
    check.done()
    return ServerGroupPatch(name=name, tags=tags)
