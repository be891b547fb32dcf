"""CloudscaleClient against the real emulator over loopback HTTP."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from campaign.seams.relay import Relay
from fixtures.emulator import TOKEN, RunningEmulator

from cloudscale_autoscaler.cloud.client import LOOKUP_OPERATION, CloudscaleClient
from cloudscale_autoscaler.cloud.errors import (
    AuthenticationError,
    CapacityError,
    CloudError,
    InvalidRequestError,
    QuotaExceededError,
    RateLimitedError,
    UnavailableError,
)
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP, TAG_REQUEST, ServerSpec
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.settings.types import CloudscaleConfig

GROUP_LPG1 = "5e0a4c1e-0b7a-4d47-8f63-1a2b3c4d5e03"  # the emulator's fixed server group

Calls = list[tuple[str, str]]
ClientFactory = Callable[..., CloudscaleClient]


@pytest.fixture
async def make_client(
    emulator: RunningEmulator,
) -> AsyncIterator[Callable[..., CloudscaleClient]]:
    """Clients for the emulator with fast backoff; each records (operation, status) per
    HTTP attempt in `client.calls`."""
    made: list[CloudscaleClient] = []

    def make(url: str | None = None, token: str = TOKEN, **options: Any) -> CloudscaleClient:
        calls: Calls = []
        options.setdefault("backoff_base", 0.001)
        options.setdefault("max_retries", 3)
        client = CloudscaleClient(
            url or emulator.url,
            token,
            on_request=lambda op, status, seconds: calls.append((op, status)),
            **options,
        )
        client.calls = calls  # type: ignore[attr-defined]
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


def spec(name: str, **fields: Any) -> ServerSpec:
    fields.setdefault("tags", {TAG_CLUSTER: "prod", TAG_GROUP: "workers"})
    return ServerSpec(name=name, flavor="flex-4-2", image="debian-12", **fields)


def calls_of(client: CloudscaleClient) -> Calls:
    calls: Calls = client.calls  # type: ignore[attr-defined]
    return calls


# ---- reads ---------------------------------------------------------------------------------


async def test_catalogue(make_client: ClientFactory) -> None:
    client = make_client()
    flavors = {f.slug: f for f in await client.list_flavors()}
    assert (flavors["flex-4-2"].vcpu_count, flavors["flex-4-2"].memory_gb) == (2, 4.0)
    assert flavors["flex-4-2"].gpu is None
    assert "lpg1" in flavors["flex-4-2"].zones
    gpus = [f for f in flavors.values() if f.gpu is not None]
    assert gpus and all(f.gpu is not None and f.gpu.count >= 1 for f in gpus)
    images = {i.slug: i for i in await client.list_images()}
    assert images["debian-12"].name
    regions = {r.slug: r.zones for r in await client.list_regions()}
    assert regions == {"rma": ("rma1",), "lpg": ("lpg1",)}
    assert calls_of(client) == [
        ("list_flavors", "200"),
        ("list_images", "200"),
        ("list_regions", "200"),
    ]


async def test_flavor_cache_makes_one_request(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    # The first callers all arrive while the fetch is in flight: they share it.
    await emulator.admin.set_faults({"latency": {"list_flavors": {"fixed_ms": 100}}})
    results = await asyncio.gather(*(client.list_flavors() for _ in range(10)))
    for _ in range(5):
        results.append(await client.list_flavors())
    assert all(result == results[0] for result in results)
    assert len(results[0]) > 5
    assert (await emulator.admin.stats())["list_flavors"] == {"200": 1}


async def test_flavor_cache_expires(emulator: RunningEmulator, make_client: ClientFactory) -> None:
    client = make_client(flavor_ttl_seconds=0.0)
    for _ in range(3):
        await client.list_flavors()
    assert (await emulator.admin.stats())["list_flavors"] == {"200": 3}


async def test_flavor_fetch_failure_is_not_cached(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_retries=0)
    await emulator.admin.set_faults({"error_rate": {"list_flavors": {"rate": 1.0, "status": 503}}})
    failures = await asyncio.gather(
        *(client.list_flavors() for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(f, UnavailableError) for f in failures)
    await emulator.admin.clear_faults()
    assert await client.list_flavors()
    assert (await emulator.admin.stats())["list_flavors"] == {"503": 1, "200": 1}


async def test_list_servers_returns_only_this_cluster(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    admin = emulator.admin
    mine = await admin.populate(3, {TAG_CLUSTER: "prod", TAG_GROUP: "workers"})
    await admin.populate(2, {TAG_CLUSTER: "staging", TAG_GROUP: "workers"})
    await admin.populate(2, {TAG_CLUSTER: "prod-2"})
    await admin.populate(2, {"team": "infra"})
    await admin.populate(1, {})
    client = make_client()
    servers = await client.list_servers("prod")
    assert sorted(s.uuid for s in servers) == sorted(mine)
    assert all(s.tags[TAG_CLUSTER] == "prod" and s.status == "running" for s in servers)
    assert {(s.flavor_slug, s.zone_slug) for s in servers} == {("flex-4-2", "rma1")}
    assert await client.list_servers("nobody") == []


async def test_list_servers_many(emulator: RunningEmulator, make_client: ClientFactory) -> None:
    uuids = await emulator.admin.populate(5000, {TAG_CLUSTER: "big"})
    await emulator.admin.populate(100, {TAG_CLUSTER: "other"})
    servers = await make_client().list_servers("big")
    assert [s.uuid for s in servers] == uuids  # the API lists in creation order


# ---- create and delete ---------------------------------------------------------------------


async def test_create_sends_every_field(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    full = ServerSpec(
        name="prod-workers-x1.example.net",
        flavor="flex-8-4",
        image="ubuntu-24.04",
        zone="lpg1",
        volume_size_gb=25,
        ssh_keys=("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG4 user@host",),
        server_groups=(GROUP_LPG1,),
        use_public_network=True,
        use_private_network=True,
        use_ipv6=False,
        user_data="#cloud-config\nhostname: x1\n",
        tags={TAG_CLUSTER: "prod", TAG_GROUP: "workers", "team": "infra"},
    )
    server = await client.create_server(full)
    assert (server.name, server.flavor_slug, server.zone_slug) == (
        "prod-workers-x1.example.net",
        "flex-8-4",
        "lpg1",
    )
    request_id = server.tags.pop(TAG_REQUEST)
    assert len(request_id) == 32 and int(request_id, 16) >= 0
    assert server.tags == {TAG_CLUSTER: "prod", TAG_GROUP: "workers", "team": "infra"}

    (raw,) = await emulator.admin.servers()
    assert raw["uuid"] == server.uuid
    assert raw["image"]["slug"] == "ubuntu-24.04"
    assert [v["size_gb"] for v in raw["volumes"]] == [25]
    assert [g["uuid"] for g in raw["server_groups"]] == [GROUP_LPG1]
    interfaces = {i["type"]: i for i in raw["interfaces"]}
    assert set(interfaces) == {"public", "private"}
    assert {a["version"] for a in interfaces["public"]["addresses"]} == {4}  # no IPv6
    assert raw["tags"][TAG_REQUEST] == request_id
    # ssh_keys and user_data never appear in the API's server JSON: read the stored record.
    record = emulator.state.servers[server.uuid]
    assert record.ssh_keys == full.ssh_keys
    assert record.user_data == full.user_data


async def test_create_minimal_spec(emulator: RunningEmulator, make_client: ClientFactory) -> None:
    client = make_client()
    server = await client.create_server(ServerSpec("bare", "flex-4-2", "debian-12"))
    assert server.status == "changing"
    (raw,) = await emulator.admin.servers()
    assert raw["zone"]["slug"] == "rma1"  # the project's default zone
    assert raw["server_groups"] == []
    assert set(raw["tags"]) == {TAG_REQUEST}


async def test_create_keeps_a_caller_chosen_request_tag(make_client: ClientFactory) -> None:
    tags = {TAG_CLUSTER: "prod", TAG_REQUEST: "chosen-by-engine"}
    server = await make_client().create_server(spec("chosen", tags=tags))
    assert server.tags[TAG_REQUEST] == "chosen-by-engine"


async def test_delete_and_404_is_success(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    server = await client.create_server(spec("doomed"))
    await client.delete_server(server.uuid)
    await client.delete_server(server.uuid)  # 404: already gone
    await client.delete_server("00000000-0000-0000-0000-000000000000")
    assert await emulator.admin.servers() == []
    deletions = await emulator.admin.deletions()
    assert [(d["uuid"], d["by"]) for d in deletions] == [(server.uuid, "api")]
    assert (await emulator.admin.stats())["delete_server"] == {"204": 1, "404": 2}
    assert client.retries == {}


@pytest.mark.parametrize("mode", ["drop", "504"])
async def test_lost_create_response_yields_exactly_one_server(
    emulator: RunningEmulator, make_client: ClientFactory, mode: str
) -> None:
    client = make_client()
    await emulator.admin.set_faults({"lose_create_responses": {"count": 1, "mode": mode}})
    server = await client.create_server(spec("lost-1"))
    servers = await emulator.admin.servers()
    assert [s["uuid"] for s in servers] == [server.uuid]
    assert server.tags[TAG_CLUSTER] == "prod"
    # One POST only: the lookup found the server, nothing was re-sent.
    failed = "error" if mode == "drop" else "504"
    assert calls_of(client) == [("create_server", failed), (LOOKUP_OPERATION, "200")]
    assert (await emulator.admin.stats())["create_server"] == {
        ("dropped" if mode == "drop" else "504"): 1
    }
    assert client.retries["create_server_recovered"] == 1


async def test_lost_create_response_found_even_without_retries(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_retries=0)
    await emulator.admin.set_faults({"lose_create_responses": {"count": 1, "mode": "drop"}})
    server = await client.create_server(spec("lost-2"))
    assert [s["uuid"] for s in await emulator.admin.servers()] == [server.uuid]


async def test_create_is_resent_only_after_a_lookup_proves_absence(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    # A 500 may hide a created server: each re-send must be preceded by a lookup.
    await emulator.admin.set_faults({"fail_next_creates": {"count": 2, "kind": "server_error"}})
    server = await client.create_server(spec("careful"))
    assert calls_of(client) == [
        ("create_server", "500"),
        (LOOKUP_OPERATION, "200"),
        ("create_server", "500"),
        (LOOKUP_OPERATION, "200"),
        ("create_server", "201"),
    ]
    assert [s["uuid"] for s in await emulator.admin.servers()] == [server.uuid]
    assert client.retries["create_server"] == 2


async def test_create_429_is_resent_without_lookup(
    emulator: RunningEmulator, make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(max_retries=2)
    faults = {"rate_limit": {"create_server": {"rate": 1.0, "retry_after": 0}}}
    await emulator.admin.set_faults(faults)
    with pytest.raises(RateLimitedError) as caught:
        await client.create_server(spec("throttled"))
    assert caught.value.status == 429
    assert "Request was throttled" in caught.value.message
    assert calls_of(client) == [("create_server", "429")] * 3
    assert client.retries == {"create_server": 2}
    assert "cloudscale API create_server: retry 2/2" in caplog.text
    assert await emulator.admin.servers() == []


async def test_create_against_a_down_api_reports_unknown_outcome(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_retries=2)
    await emulator.admin.set_faults({"down": True})
    with pytest.raises(UnavailableError) as caught:
        await client.create_server(spec("dark"))
    assert "outcome unknown" in caught.value.message
    assert TAG_REQUEST in caught.value.message
    # Never re-sent: no lookup ever proved the first attempt had no effect.
    assert [op for op, _ in calls_of(client)].count("create_server") == 1
    await emulator.admin.clear_faults()
    assert await emulator.admin.servers() == []


async def test_429_storm_is_survived(emulator: RunningEmulator, make_client: ClientFactory) -> None:
    client = make_client(max_retries=12)
    await emulator.admin.set_faults({"rate_limit": {"*": {"rate": 0.5, "retry_after": 0}}})
    await emulator.admin.populate(4, {TAG_CLUSTER: "prod"})
    for _ in range(10):
        assert len(await client.list_servers("prod")) == 4
    created = [await client.create_server(spec(f"storm-{i}")) for i in range(5)]
    stats = await emulator.admin.stats()
    assert stats["list_servers"]["429"] == client.retries["list_servers"] > 0
    assert stats["create_server"]["429"] == client.retries["create_server"] > 0
    assert stats["create_server"]["201"] == 5
    assert len(await emulator.admin.servers()) == 4 + len(created)


async def test_get_5xx_retried_then_success(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_retries=10)
    await emulator.admin.set_faults({"error_rate": {"list_images": {"rate": 0.5, "status": 502}}})
    for _ in range(10):
        assert await client.list_images()
    stats = (await emulator.admin.stats())["list_images"]
    assert stats["200"] == 10
    assert stats["502"] == client.retries["list_images"] > 0


async def test_delete_retried_on_503(emulator: RunningEmulator, make_client: ClientFactory) -> None:
    client = make_client(max_retries=10)
    uuids = await emulator.admin.populate(6, {TAG_CLUSTER: "prod"})
    await emulator.admin.set_faults({"error_rate": {"delete_server": {"rate": 0.5}}})
    for uuid in uuids:
        await client.delete_server(uuid)
    assert await emulator.admin.servers() == []
    assert (await emulator.admin.stats())["delete_server"]["503"] == client.retries["delete_server"]


@pytest.mark.parametrize(("down", "status"), [(True, 503), ("reset", None)])
async def test_down_api_is_unavailable_after_retries(
    emulator: RunningEmulator, make_client: ClientFactory, down: object, status: int | None
) -> None:
    client = make_client(max_retries=2)
    await emulator.admin.set_faults({"down": down})
    with pytest.raises(UnavailableError) as caught:
        await client.list_servers("prod")
    assert caught.value.status == status
    assert caught.value.operation == "list_servers"
    assert len(calls_of(client)) == 3
    assert client.retries == {"list_servers": 2}


async def test_unreachable_api(make_client: ClientFactory) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = make_client(url=f"http://127.0.0.1:{port}/v1", max_retries=2)
    with pytest.raises(UnavailableError) as caught:
        await client.list_images()
    assert caught.value.status is None
    assert "ConnectError" in caught.value.message
    # A create that never connected is provably unsent: retried without any lookup.
    with pytest.raises(UnavailableError):
        await client.create_server(spec("nowhere"))
    assert calls_of(client) == [("list_images", "error")] * 3 + [("create_server", "error")] * 3


# ---- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "cls", "text"),
    [
        ({"fail_next_creates": {"kind": "quota"}}, QuotaExceededError, "Quota exceeded"),
        ({"quota": {"max_servers": 0}}, QuotaExceededError, "servers (limit 0, in use 0)"),
        ({"fail_next_creates": {"kind": "capacity"}}, CapacityError, "Insufficient capacity"),
        ({"zones_out_of_capacity": ["rma1"]}, CapacityError, "in zone rma1 for flavor flex-4-2"),
        ({"fail_next_creates": {"kind": "invalid"}}, InvalidRequestError, "name: Emulated"),
    ],
)
async def test_create_failures_are_typed_and_not_retried(
    emulator: RunningEmulator,
    make_client: ClientFactory,
    faults: dict[str, Any],
    cls: type[CloudError],
    text: str,
) -> None:
    client = make_client()
    await emulator.admin.set_faults(faults)
    with pytest.raises(cls) as caught:
        await client.create_server(spec("refused"))
    assert caught.value.status == 400
    assert text in caught.value.message
    assert calls_of(client) == [("create_server", "400")]


async def test_field_errors_carry_the_api_text_and_never_the_token(
    make_client: ClientFactory,
) -> None:
    client = make_client()
    # The API echoes the bad slug, here the token itself.
    with pytest.raises(InvalidRequestError) as caught:
        await client.create_server(ServerSpec("-bad-", "flex-4-2", TOKEN, volume_size_gb=5))
    message = caught.value.message
    assert "name: Enter a valid host name or FQDN" in message
    assert "image: Object with slug=<redacted> does not exist." in message
    assert "volume_size_gb: Ensure this value is greater than or equal to 10." in message
    for shown in (message, str(caught.value), repr(caught.value)):
        assert TOKEN not in shown


async def test_wrong_token(make_client: ClientFactory) -> None:
    client = make_client(token="wrong-token-value")
    with pytest.raises(AuthenticationError) as caught:
        await client.list_servers("prod")
    assert caught.value.status == 401
    assert caught.value.message == "Invalid token."
    assert calls_of(client) == [("list_servers", "401")]  # not retried


async def test_transport_errors_never_show_the_token(make_client: ClientFactory) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = make_client(url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    with pytest.raises(UnavailableError) as caught:
        await client.create_server(spec("x"))
    assert TOKEN not in str(caught.value) and TOKEN not in repr(client)


# ---- pacing --------------------------------------------------------------------------------


async def test_concurrent_mutations_are_bounded(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_concurrent_mutations=2)
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 150}}})
    tasks = [asyncio.create_task(client.create_server(spec(f"c{i}"))) for i in range(6)]
    seen: list[int] = []
    while not all(task.done() for task in tasks):
        seen.append((await emulator.admin.in_flight()).get("create_server", 0))
    await asyncio.gather(*tasks)
    assert max(seen) <= 2
    assert (client.mutations.peak, client.mutations.in_flight) == (2, 0)
    assert len(await emulator.admin.servers()) == 6


async def test_unbounded_enough_mutations_run_together(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_concurrent_mutations=10)
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 150}}})
    await asyncio.gather(*(client.create_server(spec(f"p{i}")) for i in range(6)))
    assert client.mutations.peak == 6


async def test_rate_limit_paces_requests(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(requests_per_second=20.0)
    assert client.rate_limiter is not None
    started = time.monotonic()
    await asyncio.gather(*(client.list_images() for _ in range(30)))
    # The first 20 pass on the burst; the other 10 cannot go before 10 more tokens have come,
    # half a second at 20 per second however busy the machine is. (How many of them had to
    # sleep depends on how long the first ones took, so only "some" is certain.)
    assert time.monotonic() - started >= 10 / 20.0 - 0.01
    assert client.rate_limiter.waits >= 1
    assert (await emulator.admin.stats())["list_images"] == {"200": 30}


async def test_observer_failure_does_not_break_calls(emulator: RunningEmulator) -> None:
    def broken(operation: str, status: str, seconds: float) -> None:
        raise RuntimeError("metrics down")

    async with CloudscaleClient(emulator.url, TOKEN, on_request=broken) as client:
        assert await client.list_regions()


# ---- construction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"url": "ftp://x/v1"}, "url: expected http(s)://host"),
        ({"url": "api.cloudscale.ch/v1"}, "url: expected"),
        ({"timeout_seconds": 0}, "timeout_seconds: expected > 0, got 0"),
        ({"max_concurrent_mutations": 0}, "max_concurrent_mutations: expected > 0, got 0"),
        ({"requests_per_second": -1.0}, "requests_per_second: expected > 0 or None"),
        ({"flavor_ttl_seconds": -1}, "flavor_ttl_seconds: expected >= 0"),
        ({"max_retries": -1}, "max_retries: expected >= 0"),
        ({"backoff_base": -0.1}, "backoff_base: expected >= 0"),
        ({"token": "secret\nX-Injected: 1"}, "token: contains whitespace"),
    ],
)
def test_bad_options(options: dict[str, Any], fragment: str) -> None:
    url = options.pop("url", "https://api.cloudscale.ch/v1")
    token = options.pop("token", TOKEN)
    with pytest.raises(ValueError) as caught:
        CloudscaleClient(url, token, **options)
    assert fragment in str(caught.value)
    assert "secret" not in str(caught.value)


async def test_from_config(emulator: RunningEmulator, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = CloudscaleConfig(
        url=emulator.url + "/",
        token_file=token_file,
        timeout_seconds=5.0,
        max_concurrent_creates=3,
        requests_per_second=50.0,
    )
    async with CloudscaleClient.from_config(config) as client:
        assert client.mutations.limit == 3
        assert client.rate_limiter is not None and client.rate_limiter.rate == 50.0
        assert TOKEN not in repr(client)
        assert await client.list_servers("prod") == []
    direct = CloudscaleConfig(url=emulator.url, token=TOKEN)
    async with CloudscaleClient.from_config(direct) as client:
        cloud: Cloud = client  # mypy checks the protocol is implemented
        assert await cloud.list_regions()


async def test_timeout_is_unavailable(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(timeout_seconds=0.1, max_retries=1)
    await emulator.admin.set_faults({"latency": {"list_images": {"fixed_ms": 5000}}})
    with pytest.raises(UnavailableError) as caught:
        await client.list_images()
    await emulator.admin.clear_faults()  # releases the requests still held by the latency
    assert "Timeout" in caught.value.message
    assert calls_of(client) == [("list_images", "error")] * 2


async def test_responses_are_freed_without_a_garbage_collection(emulator: RunningEmulator) -> None:
    # A regression test: httpx's response <-> stream cycle kept every listing's body alive
    # until a full collection, so memory grew with each Refresh at large N.
    await emulator.admin.populate(200, {TAG_CLUSTER: "prod"})
    async with CloudscaleClient(emulator.url, TOKEN) as client:
        await client.list_servers("prod")  # warm up pools and caches
        gc.collect()
        gc.disable()
        try:
            # Counted before and after, as responses other tests' threads still hold are not ours.
            before = _responses()
            for _ in range(5):
                assert len(await client.list_servers("prod")) == 200
            after = _responses()
        finally:
            gc.enable()
    assert after - before == 0


def _responses() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, httpx.Response))


async def test_a_timed_out_create_is_looked_for_never_sent_again(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    """The API takes longer than the client's timeout and lists the server only once its create
    is carried out: lookups that miss it prove nothing, so the create is looked for until it
    appears, and sent once (sent again, each copy became a server)."""
    client = make_client(timeout_seconds=0.3, max_retries=10, backoff_base=0.2)
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 1000}}})
    server = await client.create_server(spec("slow"))
    await emulator.admin.clear_faults()
    assert [op for op, _ in calls_of(client)].count("create_server") == 1
    assert calls_of(client)[-1] == (LOOKUP_OPERATION, "200")
    assert [s["uuid"] for s in await emulator.admin.servers()] == [server.uuid]
    assert client.retries["create_server_recovered"] == 1


@pytest.mark.parametrize("failed", [0, 2])
async def test_a_create_whose_connection_broke_is_looked_for_never_sent_again(
    emulator: RunningEmulator, make_client: ClientFactory, failed: int
) -> None:
    """The connection breaks after the POST went out, while the API is still carrying it out
    (it lists the server a second later): the API goes on without the client, so a lookup
    that misses the server proves nothing and the create is never sent again (the seams
    campaign's cut link made one request two servers). `failed`: lookups the cut refuses
    first, as while the link is down."""
    relay = Relay("127.0.0.1", int(httpx.URL(emulator.url).port or 0))
    await relay.start()
    client = make_client(relay.url, max_retries=10, backoff_base=0.2)
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 1500}}})
    creating = asyncio.create_task(client.create_server(spec("cut-off")))
    await asyncio.sleep(0.3)  # the POST is with the API (loopback), not carried out before 1.5 s
    relay.sever()
    await asyncio.sleep(0.2 * failed)
    relay.mend()
    try:
        server = await creating
    finally:
        relay.close()
        await emulator.admin.clear_faults()
    assert [op for op, _ in calls_of(client)].count("create_server") == 1, calls_of(client)
    assert [s["uuid"] for s in await emulator.admin.servers()] == [server.uuid]
    assert client.retries["create_server_recovered"] == 1


async def test_a_create_that_stays_unanswered_has_an_unknown_outcome(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    """Still not listed when the retries run out: the outcome is unknown (never "not
    created"), and it was sent once."""
    client = make_client(timeout_seconds=0.1, max_retries=2)
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 3000}}})
    with pytest.raises(UnavailableError) as caught:
        await client.create_server(spec("slower"))
    await emulator.admin.clear_faults()
    assert "outcome unknown" in caught.value.message and "Timeout" in caught.value.message
    assert [op for op, _ in calls_of(client)].count("create_server") == 1
