"""JSON -> models, defensively and cheaply.

A Refresh lists up to 20,000 servers, so server parsing is a straight sequence of dict lookups
per server: no validation framework, no per-field helper calls on the hot path. Unknown fields
are ignored; optional fields may be missing or null. Only what we cannot work without (a
server's uuid, a flavor's slug) raises CloudError.
"""

from __future__ import annotations

import gc
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import (
    Flavor,
    Gpu,
    Image,
    Network,
    Region,
    Server,
    ServerGroup,
    Subnet,
)

T = TypeVar("T")


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding a 20,000-server listing allocates about a million dicts and strings, which
    triggers the cyclic GC over and over (2-3x the decode time) although a JSON tree can hold
    no cycle. The pause is synchronous, so no other coroutine runs meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def decode(content: bytes, parse: Callable[[Any], T]) -> T:
    """json.loads + `parse` in one GC pause. ValueError for a body that is not JSON."""
    with _gc_paused():
        return parse(json.loads(content))


_NOT_WHITESPACE = re.compile(r"[^ \t\n\r]")
_DECODER = json.JSONDecoder()


def decode_servers(content: bytes, operation: str = "") -> list[Server]:
    """A server listing, decoded one server at a time: the JSON tree of one server is freed
    before the next is decoded, so the few strings each Server keeps are not scattered among
    the freed remains of a whole listing's tree. Decoded whole, a 5,000-server listing left
    ~30 MB of mostly empty pymalloc arenas behind that the kept strings pin (bench/footprint.py).
    A body that is not an array is decoded whole, for parse_servers' error."""
    text = content.decode(json.detect_encoding(content), "surrogatepass")
    with _gc_paused():
        servers = _each_element(text, lambda raw: parse_server(raw, operation))
    if servers is None:
        return decode(content, lambda body: parse_servers(body, operation))
    return servers


def _each_element(text: str, parse: Callable[[Any], T]) -> list[T] | None:
    """`parse` of each element of the JSON array `text`, or None if it is not an array.
    Syntax errors raise json.JSONDecodeError (a ValueError), as json.loads does."""
    index = _skip(text, 0)
    if not text.startswith("[", index):
        return None
    items: list[T] = []
    index = _skip(text, index + 1)
    closed = text.startswith("]", index)
    while not closed:
        raw, index = _DECODER.raw_decode(text, index)
        items.append(parse(raw))
        index = _skip(text, index)
        closed = text.startswith("]", index)
        if not closed:
            if not text.startswith(",", index):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, index)
            index = _skip(text, index + 1)
    end = _skip(text, index + 1)
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return items


def _skip(text: str, index: int) -> int:
    """The index of the first non-whitespace character at or after `index`."""
    found = _NOT_WHITESPACE.search(text, index)
    return len(text) if found is None else found.start()


def _interned_tags(tags: dict[str, Any]) -> dict[str, Any]:
    """Tag names and values repeat across servers (cluster, group): one string each."""
    return {
        sys.intern(key): sys.intern(value) if type(value) is str else value
        for key, value in tags.items()
    }


def _malformed(what: str, detail: str, operation: str) -> CloudError:
    return CloudError(f"malformed API response: {what}: {detail}", 200, operation)


def _as_list(body: Any, what: str, operation: str) -> list[Any]:
    if not isinstance(body, list):
        raise _malformed(what, f"expected a JSON array, got {type(body).__name__}", operation)
    return body


def _zone_slugs(raw: Any) -> tuple[str, ...]:
    """[{"slug": "lpg1"}, ...] -> ("lpg1", ...); tolerates null and bare strings."""
    if not isinstance(raw, list):
        return ()
    slugs = []
    for item in raw:
        slug = item.get("slug") if isinstance(item, dict) else item
        if isinstance(slug, str) and slug:
            slugs.append(slug)
    return tuple(slugs)


def parse_server(raw: Any, operation: str = "") -> Server:
    if not isinstance(raw, dict):
        raise _malformed("server", f"expected a JSON object, got {type(raw).__name__}", operation)
    uuid = raw.get("uuid")
    if not uuid or not isinstance(uuid, str):
        name = raw.get("name")
        raise _malformed("server", f"missing uuid (name={name!r})", operation)
    flavor = raw.get("flavor")
    zone = raw.get("zone")
    tags = raw.get("tags")
    # Tags: an object's entries are kept (JSON keys are always strings) without checking
    # the values: a non-string value simply never equals the string a tag filter compares it
    # with. Status, flavor, zone and tags repeat across servers: interned, one string each.
    return Server(
        uuid,
        raw.get("name") or "",
        sys.intern(raw.get("status") or "unknown"),
        sys.intern(flavor.get("slug") or "") if type(flavor) is dict else "",
        sys.intern(zone.get("slug") or "") if type(zone) is dict else "",
        raw.get("created_at") or "",
        _interned_tags(tags) if type(tags) is dict else {},
    )


def parse_servers(body: Any, operation: str = "") -> list[Server]:
    return [parse_server(raw, operation) for raw in _as_list(body, "servers", operation)]


def _number(raw: dict[str, Any], key: str, what: str, operation: str) -> float:
    """A finite number: JSON may spell infinity (1e999) or an integer no float holds, which
    int() and float() refuse with OverflowError, not the ValueError a malformed body is."""
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _malformed(what, f"{key} must be a number, got {value!r:.80}", operation)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _malformed(what, f"{key} must be a finite number, got {value!s:.80}", operation)
    return number


def _required(raw: Any, key: str, what: str, operation: str) -> str:
    """raw[key] of an object we cannot work without (a flavor's slug, a network's uuid)."""
    if not isinstance(raw, dict):
        raise _malformed(what, f"expected a JSON object, got {type(raw).__name__}", operation)
    value = raw.get(key)
    if not value or not isinstance(value, str):
        raise _malformed(what, f"missing {key}", operation)
    return value


def _required_slug(raw: Any, what: str, operation: str) -> str:
    return _required(raw, "slug", what, operation)


def _parse_gpu(raw: Any) -> Gpu | None:
    if not isinstance(raw, dict):
        return None
    count = raw.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return None
    vram = raw.get("vram_per_gpu_gb")
    return Gpu(
        count=count,
        name=str(raw.get("name") or ""),
        vram_per_gpu_gb=float(vram) if isinstance(vram, int | float) else None,
    )


def parse_flavor(raw: Any, operation: str = "") -> Flavor:
    slug = _required_slug(raw, "flavor", operation)
    what = f"flavor {slug}"
    return Flavor(
        slug=slug,
        name=str(raw.get("name") or slug),
        vcpu_count=int(_number(raw, "vcpu_count", what, operation)),
        memory_gb=float(_number(raw, "memory_gb", what, operation)),
        gpu=_parse_gpu(raw.get("gpu")),
        zones=_zone_slugs(raw.get("zones")),
    )


def parse_flavors(body: Any, operation: str = "") -> list[Flavor]:
    return [parse_flavor(raw, operation) for raw in _as_list(body, "flavors", operation)]


def parse_image(raw: Any, operation: str = "") -> Image:
    slug = _required_slug(raw, "image", operation)
    return Image(
        slug=slug,
        name=str(raw.get("name") or slug),
        operating_system=str(raw.get("operating_system") or ""),
        zones=_zone_slugs(raw.get("zones")),
    )


def parse_images(body: Any, operation: str = "") -> list[Image]:
    return [parse_image(raw, operation) for raw in _as_list(body, "images", operation)]


def parse_region(raw: Any, operation: str = "") -> Region:
    slug = _required_slug(raw, "region", operation)
    return Region(slug=slug, zones=_zone_slugs(raw.get("zones")))


def parse_regions(body: Any, operation: str = "") -> list[Region]:
    return [parse_region(raw, operation) for raw in _as_list(body, "regions", operation)]


def _uuids(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(i["uuid"] for i in raw if isinstance(i, dict) and isinstance(i.get("uuid"), str))


def parse_network(raw: Any, operation: str = "") -> Network:
    uuid = _required(raw, "uuid", "network", operation)
    zone = raw.get("zone")
    return Network(
        uuid=uuid,
        name=str(raw.get("name") or ""),
        zone=str(zone.get("slug") or "") if isinstance(zone, dict) else "",
        subnets=_uuids(raw.get("subnets")),
    )


def parse_networks(body: Any, operation: str = "") -> list[Network]:
    return [parse_network(raw, operation) for raw in _as_list(body, "networks", operation)]


def parse_subnet(raw: Any, operation: str = "") -> Subnet:
    uuid = _required(raw, "uuid", "subnet", operation)
    network = raw.get("network")
    network_uuid = network.get("uuid") if isinstance(network, dict) else None
    return Subnet(
        uuid=uuid,
        cidr=str(raw.get("cidr") or ""),
        network_uuid=network_uuid if isinstance(network_uuid, str) else "",
    )


def parse_subnets(body: Any, operation: str = "") -> list[Subnet]:
    return [parse_subnet(raw, operation) for raw in _as_list(body, "subnets", operation)]


def parse_server_group(raw: Any, operation: str = "") -> ServerGroup:
    """A server group: its uuid is required; `servers` [{href, uuid, name}] gives the member
    uuids (entries without one are skipped); tags as for servers."""
    uuid = _required(raw, "uuid", "server group", operation)
    zone = raw.get("zone")
    tags = raw.get("tags")
    return ServerGroup(
        uuid=uuid,
        name=str(raw.get("name") or ""),
        zone=str(zone.get("slug") or "") if isinstance(zone, dict) else "",
        servers=_uuids(raw.get("servers")),
        tags=dict(tags) if isinstance(tags, dict) else {},
    )


def parse_server_groups(body: Any, operation: str = "") -> list[ServerGroup]:
    return [
        parse_server_group(raw, operation) for raw in _as_list(body, "server groups", operation)
    ]
