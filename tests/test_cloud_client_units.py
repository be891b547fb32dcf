"""Pure logic of the cloud client: parsing, error texts and classes, pacing and backoff."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from cloudscale_autoscaler.cloud.errors import (
    AuthenticationError,
    CapacityError,
    CloudError,
    InvalidRequestError,
    NotFoundError,
    QuotaExceededError,
    RateLimitedError,
    UnavailableError,
)
from cloudscale_autoscaler.cloud.httperrors import (
    MAX_MESSAGE_CHARS,
    REDACTED,
    api_message,
    error_for_status,
    error_from_response,
)
from cloudscale_autoscaler.cloud.models import Flavor, Gpu, Image, Region, Server
from cloudscale_autoscaler.cloud.parse import (
    decode,
    decode_servers,
    parse_flavors,
    parse_images,
    parse_regions,
    parse_server,
    parse_servers,
)
from cloudscale_autoscaler.cloud.ratelimit import (
    ConcurrencyLimit,
    TokenBucket,
    backoff_delay,
    parse_retry_after,
)

UUID = "2db0a3cc-0a7f-4b8c-9c2b-1e0fa1d1c0de"

# ---- servers ----------------------------------------------------------------------------


FULL_SERVER = {
    "href": f"https://api.cloudscale.ch/v1/servers/{UUID}",
    "uuid": UUID,
    "name": "prod-workers-abc12",
    "status": "running",
    "created_at": "2019-05-27T16:45:32.241824Z",
    "zone": {"slug": "lpg1"},
    "flavor": {"slug": "flex-8-4", "name": "Flex-8-4", "vcpu_count": 4, "memory_gb": 8},
    "image": {"slug": "debian-12", "name": "Debian 12", "operating_system": "Debian"},
    "volumes": [{"type": "ssd", "size_gb": 50}],
    "interfaces": [{"type": "public", "addresses": []}],
    "server_groups": [],
    "tags": {"k8s-cluster": "prod", "k8s-autoscaler-group": "workers"},
    "some_future_field": {"nested": [1, 2, 3]},
}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            FULL_SERVER,
            Server(
                UUID,
                "prod-workers-abc12",
                "running",
                "flex-8-4",
                "lpg1",
                "2019-05-27T16:45:32.241824Z",
                {"k8s-cluster": "prod", "k8s-autoscaler-group": "workers"},
            ),
            id="full-with-unknown-fields",
        ),
        pytest.param({"uuid": UUID}, Server(UUID, "", "unknown"), id="only-uuid"),
        pytest.param(
            {
                "uuid": UUID,
                "name": "a",
                "status": "changing",
                "flavor": None,
                "zone": None,
                "tags": None,
                "created_at": None,
            },
            Server(UUID, "a", "changing"),
            id="nulls",
        ),
        pytest.param(
            {"uuid": UUID, "flavor": "flex-4-2", "zone": ["lpg1"], "tags": ["x"]},
            Server(UUID, "", "unknown"),
            id="wrong-shapes-ignored",
        ),
    ],
)
def test_parse_server(raw: dict[str, Any], expected: Server) -> None:
    assert parse_server(raw) == expected


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        pytest.param({"name": "nameless"}, "missing uuid (name='nameless')", id="no-uuid"),
        pytest.param({"uuid": ""}, "missing uuid", id="empty-uuid"),
        pytest.param({"uuid": 12}, "missing uuid", id="int-uuid"),
        pytest.param("a string", "expected a JSON object, got str", id="not-object"),
    ],
)
def test_parse_server_rejects(raw: Any, fragment: str) -> None:
    with pytest.raises(CloudError) as caught:
        parse_server(raw, "list_servers")
    assert fragment in caught.value.message
    assert caught.value.operation == "list_servers"


def test_parse_servers_needs_an_array() -> None:
    with pytest.raises(CloudError, match="expected a JSON array, got dict"):
        parse_servers({"results": []})


def test_parse_servers_many() -> None:
    raw = [dict(FULL_SERVER, uuid=f"{i:08d}-0000-0000-0000-000000000000") for i in range(500)]
    servers = parse_servers(json.loads(json.dumps(raw)))
    assert [s.uuid for s in servers] == [r["uuid"] for r in raw]
    assert all(s.flavor_slug == "flex-8-4" and s.zone_slug == "lpg1" for s in servers)


def _listing(count: int) -> list[dict[str, Any]]:
    return [
        dict(FULL_SERVER, uuid=f"{i:08d}-0000-0000-0000-000000000000", name=f"w-{i}")
        for i in range(count)
    ]


@pytest.mark.parametrize(
    "dump",
    [
        lambda raw: json.dumps(raw).encode(),
        lambda raw: json.dumps(raw, indent=2).encode(),
        lambda raw: json.dumps(raw, separators=(",", ":")).encode(),
        lambda raw: (" \r\n\t" + json.dumps(raw).replace(", {", " ,\n{") + "\n").encode(),
        lambda raw: json.dumps(raw).encode("utf-16"),
    ],
    ids=["plain", "indented", "compact", "odd-whitespace", "utf-16"],
)
@pytest.mark.parametrize("count", [0, 1, 3])
def test_decode_servers_one_at_a_time_reads_what_json_loads_reads(dump: Any, count: int) -> None:
    body = dump(_listing(count))
    assert decode_servers(body, "list_servers") == parse_servers(json.loads(body))


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[",
        b'[{"uuid": "a"}',
        b'[{"uuid": "a"} {"uuid": "b"}]',
        b'[{"uuid": "a"},]',
        b"[] x",
        b"<html>",
    ],
)
def test_decode_servers_refuses_what_json_loads_refuses(body: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(body)
    with pytest.raises(ValueError):
        decode_servers(body, "list_servers")


def test_decode_servers_of_a_body_that_is_no_array_says_what_it_got() -> None:
    with pytest.raises(CloudError, match="expected a JSON array, got dict") as caught:
        decode_servers(b' {"results": []}', "list_servers")
    assert caught.value.operation == "list_servers"


def test_decode_servers_keeps_one_copy_of_repeated_strings() -> None:
    first, second = decode_servers(json.dumps(_listing(2)).encode())
    assert first.status is second.status
    assert first.flavor_slug is second.flavor_slug and first.zone_slug is second.zone_slug
    for (key_a, value_a), (key_b, value_b) in zip(
        first.tags.items(), second.tags.items(), strict=True
    ):
        assert key_a is key_b and value_a is value_b
    assert first.name is not second.name


# ---- flavors, images, regions ---------------------------------------------------------------


def test_parse_flavors() -> None:
    body = [
        {
            "slug": "flex-4-2",
            "name": "Flex-4-2",
            "vcpu_count": 2,
            "memory_gb": 4,
            "gpu": None,
            "zones": [{"slug": "lpg1"}, {"slug": "rma1"}],
            "extra": True,
        },
        {
            "slug": "gpu2-128-16-1-200",
            "name": "GPU",
            "vcpu_count": 16,
            "memory_gb": 128,
            "gpu": {
                "count": 1,
                "name": "NVIDIA RTX PRO 6000 Max-Q",
                "vram_per_gpu_gb": 96,
                "total_vram_gb": 96,
            },
        },
        {"slug": "plus-8-2", "vcpu_count": 2, "memory_gb": 7.5, "gpu": {"count": 0}},
    ]
    assert parse_flavors(body) == [
        Flavor("flex-4-2", "Flex-4-2", 2, 4.0, None, ("lpg1", "rma1")),
        Flavor("gpu2-128-16-1-200", "GPU", 16, 128.0, Gpu(1, "NVIDIA RTX PRO 6000 Max-Q", 96.0)),
        Flavor("plus-8-2", "plus-8-2", 2, 7.5),
    ]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        pytest.param(
            {"name": "x", "vcpu_count": 1, "memory_gb": 1}, "flavor: missing slug", id="no-slug"
        ),
        pytest.param(
            {"slug": "f", "memory_gb": 1}, "flavor f: vcpu_count must be a number", id="no-vcpu"
        ),
        pytest.param(
            {"slug": "f", "vcpu_count": 1, "memory_gb": "8"},
            "flavor f: memory_gb must be a number, got '8'",
            id="string-memory",
        ),
        pytest.param(
            {"slug": "f", "vcpu_count": True, "memory_gb": 1},
            "vcpu_count must be a number, got True",
            id="bool-vcpu",
        ),
        # JSON's 1e999 is infinity and a 400-digit integer no float: int() and float() raise
        # OverflowError there, which escaped every caller expecting a CloudError.
        pytest.param(
            {"slug": "f", "vcpu_count": json.loads("1e999"), "memory_gb": 1},
            "vcpu_count must be a finite number, got inf",
            id="infinite-vcpu",
        ),
        pytest.param(
            {"slug": "f", "vcpu_count": 2, "memory_gb": 10**400},
            "memory_gb must be a finite number, got 1000",
            id="huge-memory",
        ),
        pytest.param(
            {"slug": "f", "vcpu_count": json.loads("NaN"), "memory_gb": 1},
            "vcpu_count must be a finite number, got nan",
            id="nan-vcpu",
        ),
    ],
)
def test_parse_flavor_rejects(raw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(CloudError) as caught:
        parse_flavors([raw])
    assert fragment in caught.value.message


def test_parse_images_and_regions() -> None:
    images = [
        {
            "slug": "debian-12",
            "name": "Debian 12",
            "operating_system": "Debian",
            "default_username": "debian",
            "zones": [{"slug": "rma1"}],
        },
        {"slug": "ubuntu-24.04"},
    ]
    assert parse_images(images) == [
        Image("debian-12", "Debian 12", "Debian", ("rma1",)),
        Image("ubuntu-24.04", "ubuntu-24.04"),
    ]
    regions = [{"slug": "rma", "zones": [{"slug": "rma1"}]}, {"slug": "lpg", "zones": None}]
    assert parse_regions(regions) == [Region("rma", ("rma1",)), Region("lpg")]
    with pytest.raises(CloudError, match="region: missing slug"):
        parse_regions([{"zones": []}])


# ---- error messages and classes -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b'{"detail": "Not found."}', "Not found.", id="drf-detail"),
        pytest.param(
            b'{"name": ["This field is required."], "mtu": "Must be <= 9000."}',
            "name: This field is required.; mtu: Must be <= 9000.",
            id="field-errors",
        ),
        pytest.param(b'{"name": ["a.", "b."]}', "name: a. b.", id="several-messages"),
        pytest.param(
            b'{"interfaces": [{"network": ["Unknown network."]}]}',
            "interfaces.0.network: Unknown network.",
            id="nested",
        ),
        pytest.param(b'{"non_field_errors": ["Bad combo."]}', "Bad combo.", id="non-field"),
        pytest.param(b'["Just a list."]', "Just a list.", id="bare-list"),
        pytest.param(b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>", id="html"),
        pytest.param(b"", "Service Unavailable", id="empty-uses-reason"),
        pytest.param(b"{}", "{}", id="empty-object"),
    ],
)
def test_api_message(body: bytes, expected: str) -> None:
    assert api_message(body, "Service Unavailable") == expected


def test_api_message_truncates_after_redacting() -> None:
    secret = "s3cr3t-token-value"
    # The secret straddles the truncation point: no fragment of it may survive.
    body = ("x" * (MAX_MESSAGE_CHARS - 5) + secret + "y" * 50).encode()
    message = api_message(body, secrets=(secret,))
    assert "s3cr" not in message
    assert len(message) <= MAX_MESSAGE_CHARS + 3


@pytest.mark.parametrize(
    ("status", "message", "cls"),
    [
        (401, "Invalid token.", AuthenticationError),
        (403, "You do not have permission.", AuthenticationError),
        (404, "Not found.", NotFoundError),
        (400, "Quota exceeded: max 10 servers", QuotaExceededError),
        (400, "Insufficient capacity in zone rma1 for flavor flex-4-2.", CapacityError),
        (400, "name: This field is required.", InvalidRequestError),
        (409, "Conflict.", InvalidRequestError),
        (429, "Request was throttled.", RateLimitedError),
        (500, "Server Error", UnavailableError),
        (503, "Service Unavailable", UnavailableError),
        (302, "Found", CloudError),
    ],
)
def test_error_classes(status: int, message: str, cls: type[CloudError]) -> None:
    error = error_for_status(status, message, "create_server")
    assert type(error) is cls
    assert error.status == status
    assert error.message.endswith(message)
    assert f"HTTP {status}" in str(error)
    assert error.out_of_resources == (cls in (QuotaExceededError, CapacityError))


def test_error_from_response_redacts_the_token() -> None:
    token = "very-secret-token"
    body = json.dumps({"detail": f"Invalid token {token} (Bearer {token})"}).encode()
    error = error_from_response(401, body, "Unauthorized", "list_servers", (token,))
    assert token not in str(error)
    assert error.message == f"Invalid token {REDACTED} (Bearer {REDACTED})"


# ---- pacing and backoff -------------------------------------------------------------------


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


@pytest.mark.parametrize(
    ("rate", "burst", "acquisitions", "expected_sleeps"),
    [
        (10.0, None, 10, []),  # one second's worth of burst
        (10.0, None, 12, [0.1, 0.1]),
        (2.0, 1.0, 3, [0.5, 0.5]),
        (0.5, None, 2, [2.0]),  # slower than 1/s still lets one through at once
    ],
)
async def test_token_bucket(
    rate: float, burst: float | None, acquisitions: int, expected_sleeps: list[float]
) -> None:
    fake = FakeTime()
    bucket = TokenBucket(rate, burst, clock=fake.clock, sleep=fake.sleep)
    for _ in range(acquisitions):
        await bucket.acquire()
    assert fake.sleeps == expected_sleeps
    assert bucket.waits == len(expected_sleeps)


async def test_token_bucket_refills_with_time() -> None:
    fake = FakeTime()
    bucket = TokenBucket(1.0, 1.0, clock=fake.clock, sleep=fake.sleep)
    await bucket.acquire()
    fake.now += 5.0  # idle time refills, but never beyond the burst
    await bucket.acquire()
    await bucket.acquire()
    assert fake.sleeps == [1.0]


async def test_token_bucket_is_fifo() -> None:
    import asyncio

    bucket = TokenBucket(1000.0, 1.0)
    order: list[int] = []

    async def take(i: int) -> None:
        await bucket.acquire()
        order.append(i)

    await asyncio.gather(*(take(i) for i in range(20)))
    assert order == list(range(20))


def test_token_bucket_rejects_bad_rate() -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        TokenBucket(0)


async def test_concurrency_limit_counts() -> None:
    import asyncio

    limit = ConcurrencyLimit(2)
    release = asyncio.Event()

    async def hold() -> None:
        async with limit:
            await release.wait()

    tasks = [asyncio.create_task(hold()) for _ in range(5)]
    await asyncio.sleep(0)
    assert (limit.in_flight, limit.peak) == (2, 2)
    release.set()
    await asyncio.gather(*tasks)
    assert (limit.in_flight, limit.peak) == (0, 2)


@pytest.mark.parametrize(
    ("retry", "base", "cap", "retry_after", "low", "high"),
    [
        (1, 0.2, 30.0, None, 0.0, 0.2),
        (3, 0.2, 30.0, None, 0.0, 0.8),
        (20, 0.2, 30.0, None, 0.0, 30.0),  # capped exponential
        (1, 0.2, 30.0, 5.0, 5.0, 5.0),  # Retry-After is a floor
        (1, 0.2, 30.0, 3600.0, 30.0, 30.0),  # ... but capped
        (4, 0.0, 30.0, None, 0.0, 0.0),
    ],
)
def test_backoff_delay(
    retry: int, base: float, cap: float, retry_after: float | None, low: float, high: float
) -> None:
    rng = random.Random(7)
    delays = [backoff_delay(retry, base, cap, rng, retry_after) for _ in range(200)]
    assert all(low <= d <= high for d in delays)
    if high > low:  # full jitter really spreads
        assert max(delays) - min(delays) > (high - low) / 2


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("3", 3.0),
        (" 1.5 ", 1.5),
        ("-4", 0.0),
        ("nan", None),
        ("soon", None),
        ("Thu, 01 Jan 1970 00:00:10 GMT", 5.0),  # relative to now=5
        ("Thu, 01 Jan 1970 00:00:01 GMT", 0.0),  # in the past
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, now=5.0) == expected


@pytest.mark.parametrize("enabled", [True, False])
def test_decode_restores_gc_state(enabled: bool) -> None:
    import gc

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert decode(b'[{"uuid": "u"}]', parse_servers) == [Server("u", "", "unknown")]
        assert gc.isenabled() is enabled
        with pytest.raises(ValueError):
            decode(b"<html>", parse_servers)
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
