"""CloudscaleClient's server groups: list by cluster tag, create (lost responses resolved by
the request tag), delete (404 = already gone), retries, pacing, and how the refusals a server
create meets because of its group are classified (against the emulator over loopback HTTP,
and as pure functions)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fixtures.emulator import TOKEN, RunningEmulator

from cloudscale_autoscaler.cloud.client import GROUP_LOOKUP_OPERATION, CloudscaleClient
from cloudscale_autoscaler.cloud.errors import (
    CapacityError,
    CloudError,
    HostShortageError,
    InvalidRequestError,
    NotFoundError,
    QuotaExceededError,
    RateLimitedError,
    ServerGroupFullError,
    ServerGroupGoneError,
    UnavailableError,
)
from cloudscale_autoscaler.cloud.httperrors import error_for_status, error_from_response
from cloudscale_autoscaler.cloud.models import (
    TAG_CLUSTER,
    TAG_GROUP,
    TAG_MANAGED,
    TAG_REQUEST,
    ServerGroup,
    ServerSpec,
)
from cloudscale_autoscaler.cloud.parse import parse_server_group, parse_server_groups

Calls = list[tuple[str, str]]
ClientFactory = Callable[..., CloudscaleClient]
G = "0f7a61b2-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
FULL = (
    f"Server group {G} is full: it already has 4 servers, the most an anti-affinity group may hold."
)
NO_HOST = (
    f"No distinct host available in zone rma1 for server group {G}: every host with room "
    "already runs one of its servers."
)


@pytest.fixture
async def make_client(emulator: RunningEmulator) -> AsyncIterator[ClientFactory]:
    """Clients for the emulator with fast backoff; each records (operation, status) per
    HTTP attempt in `client.calls`."""
    made: list[CloudscaleClient] = []

    def make(**options: Any) -> CloudscaleClient:
        calls: Calls = []
        options.setdefault("backoff_base", 0.001)
        options.setdefault("max_retries", 3)
        client = CloudscaleClient(
            emulator.url,
            TOKEN,
            on_request=lambda op, status, seconds: calls.append((op, status)),
            **options,
        )
        client.calls = calls  # type: ignore[attr-defined]
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


def calls_of(client: CloudscaleClient) -> Calls:
    calls: Calls = client.calls  # type: ignore[attr-defined]
    return calls


def managed(cluster: str = "prod", group: str = "workers-rma1") -> dict[str, str]:
    return {TAG_CLUSTER: cluster, TAG_GROUP: group, TAG_MANAGED: "true"}


def server(name: str, *groups: str, zone: str = "rma1") -> ServerSpec:
    return ServerSpec(
        name=name,
        flavor="flex-4-2",
        image="debian-12",
        zone=zone,
        server_groups=groups,
        tags={TAG_CLUSTER: "prod", TAG_GROUP: "workers-rma1"},
    )


async def all_groups(emulator: RunningEmulator) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=emulator.admin_url) as admin:
        groups: list[dict[str, Any]] = (await admin.get("/server-groups")).json()
    return groups


# ---- classification (pure) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "cls"),
    [
        pytest.param(400, f"server_groups: {FULL}", ServerGroupFullError, id="full"),
        pytest.param(409, f"Server group {G} is full.", ServerGroupFullError, id="full-detail"),
        pytest.param(
            400,
            f"server_groups: Object with uuid={G} does not exist.",
            ServerGroupGoneError,
            id="gone",
        ),
        pytest.param(
            400,
            f'server_groups.0: Invalid pk "{G}" - object does not exist.',
            ServerGroupGoneError,
            id="gone-drf-pk-nested",
        ),
        pytest.param(400, NO_HOST, HostShortageError, id="no-host-detail"),
        pytest.param(
            400,
            "server_groups: No host left that keeps the servers apart.",
            HostShortageError,
            id="no-host-field",
        ),
        pytest.param(
            400,
            f"server_groups: Server group {G} is in zone lpg1, not in zone rma1.",
            InvalidRequestError,
            id="zone-mismatch",
        ),
        pytest.param(
            400,
            f"name: Enter a valid host name or FQDN.; server_groups: {FULL}",
            InvalidRequestError,
            id="another-field-refused-too",
        ),
        pytest.param(
            400,
            "flavor: Object with slug=x does not exist.; "
            f"server_groups: Server group {G} is in zone lpg1, not in zone rma1.",
            InvalidRequestError,
            id="does-not-exist-on-another-field",
        ),
        pytest.param(
            400,
            f"server_groups: Server group {G} is in zone lpg1, not in zone rma1.; "
            f"server_groups: {FULL}",
            ServerGroupFullError,
            id="several-group-lines",
        ),
        pytest.param(
            400,
            f"Cannot delete server group {G}: it still has 2 servers.",
            InvalidRequestError,
            id="non-empty-delete",
        ),
        pytest.param(
            400,
            "Insufficient capacity in zone rma1 for flavor flex-4-2.",
            CapacityError,
            id="capacity-unchanged",
        ),
        pytest.param(400, "Quota exceeded: servers.", QuotaExceededError, id="quota-unchanged"),
        pytest.param(404, "Not found.", NotFoundError, id="404-first"),
        pytest.param(503, NO_HOST, UnavailableError, id="5xx-first"),
    ],
)
def test_server_group_refusals_are_classified_by_wording(
    status: int, message: str, cls: type[CloudError]
) -> None:
    error = error_for_status(status, message, "create_server")
    assert type(error) is cls
    assert (error.status, error.message, error.operation) == (status, message, "create_server")
    assert error.out_of_resources == (cls in (HostShortageError, CapacityError, QuotaExceededError))


def test_codes_of_the_server_group_refusals() -> None:
    assert [
        (type(e).__name__, e.code, e.out_of_resources)
        for e in (
            error_for_status(400, f"server_groups: {FULL}", "create_server"),
            error_for_status(400, f"server_groups: Object with uuid={G} does not exist.", "c"),
            error_for_status(400, NO_HOST, "create_server"),
        )
    ] == [
        ("ServerGroupFullError", "SERVER_GROUP_FULL", False),
        ("ServerGroupGoneError", "SERVER_GROUP_NOT_FOUND", False),
        ("HostShortageError", "NO_DISTINCT_HOST", True),
    ]


@pytest.mark.parametrize(
    ("body", "cls"),
    [
        ({"server_groups": [FULL]}, ServerGroupFullError),
        ({"server_groups": {"0": [f"Object with uuid={G} does not exist."]}}, ServerGroupGoneError),
        ({"detail": NO_HOST}, HostShortageError),
        ({"server_groups": [FULL], "name": ["This field is required."]}, InvalidRequestError),
    ],
)
def test_server_group_refusals_from_drf_bodies(body: Any, cls: type[CloudError]) -> None:
    error = error_from_response(400, json.dumps(body).encode(), "Bad Request", "create_server", ())
    assert type(error) is cls


# ---- parsing (pure) ----------------------------------------------------------------------------


def test_parse_server_group_reads_the_api_object() -> None:
    raw = {
        "href": f"https://api.cloudscale.ch/v1/server-groups/{G}",
        "uuid": G,
        "name": "load balancers",
        "type": "anti-affinity",
        "servers": [
            {"href": "https://api.cloudscale.ch/v1/servers/a", "uuid": "a", "name": "tesla"},
            {"uuid": "b", "name": "edison"},
        ],
        "zone": {"slug": "rma1"},
        "tags": {"k": "v"},
        "unknown": ["ignored"],
    }
    assert parse_server_group(raw) == ServerGroup(
        G, "load balancers", "rma1", ("a", "b"), {"k": "v"}
    )


def test_parse_server_group_tolerates_missing_and_odd_fields() -> None:
    odd = {"uuid": G, "name": None, "servers": [{"name": "x"}, "y", {"uuid": 5}], "zone": "rma1"}
    assert parse_server_group(odd) == ServerGroup(G, "", "", (), {})
    nulls = {"uuid": G, "servers": None, "zone": None, "tags": None}
    assert parse_server_group(nulls) == ServerGroup(G, "")
    with pytest.raises(CloudError, match="server group: missing uuid"):
        parse_server_group({"name": "no uuid"}, "list_server_groups")
    with pytest.raises(CloudError, match="server group: expected a JSON object, got list"):
        parse_server_group([G])
    with pytest.raises(CloudError, match="server groups: expected a JSON array, got dict"):
        parse_server_groups({"detail": "x"})
    assert parse_server_groups([{"uuid": G}, {"uuid": "h"}]) == [
        ServerGroup(G, ""),
        ServerGroup("h", ""),
    ]


# ---- create, list, delete ----------------------------------------------------------------------


async def test_create_list_and_delete(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    rma = await client.create_server_group("workers-rma1", "rma1", managed())
    lpg = await client.create_server_group("workers-lpg1", "lpg1", managed(group="workers-lpg1"))
    other = await client.create_server_group("workers-rma1", "rma1", managed(cluster="other"))
    assert (rma.name, rma.zone, rma.servers) == ("workers-rma1", "rma1", ())
    assert rma.tags == {**managed(), TAG_REQUEST: rma.tags[TAG_REQUEST]}
    assert len(rma.tags[TAG_REQUEST]) == 32
    assert lpg.zone == "lpg1"
    assert await client.list_server_groups("prod") == [rma, lpg]
    assert await client.list_server_groups("other") == [other]
    assert await client.list_server_groups("nobody") == []
    # Listed by the cluster tag, server-side: the emulator's own untagged groups never come.
    assert ("list_server_groups", "200") in calls_of(client)

    await client.delete_server_group(lpg.uuid)
    assert await client.list_server_groups("prod") == [rma]
    assert lpg.uuid not in [g["uuid"] for g in await all_groups(emulator)]
    stats = await emulator.admin.stats()
    assert stats["create_server_group"] == {"201": 3}
    assert stats["delete_server_group"] == {"204": 1}
    assert client.retries == {}


async def test_the_api_object_is_what_was_asked_for(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    group = await client.create_server_group("g", "lpg1", {TAG_CLUSTER: "prod"})
    [raw] = [g for g in await all_groups(emulator) if g["uuid"] == group.uuid]
    assert (raw["name"], raw["type"], raw["zone"], raw["tags"]) == (
        "g",
        "anti-affinity",
        {"slug": "lpg1"},
        group.tags,
    )


async def test_list_shows_the_members(make_client: ClientFactory) -> None:
    client = make_client()
    group = await client.create_server_group("g", "rma1", managed())
    first = await client.create_server(server("w1", group.uuid))
    second = await client.create_server(server("w2", group.uuid))
    await client.create_server(server("outside"))
    [listed] = await client.list_server_groups("prod")
    assert listed.servers == (first.uuid, second.uuid)
    await client.delete_server(first.uuid)
    [listed] = await client.list_server_groups("prod")
    assert listed.servers == (second.uuid,)


async def test_list_drops_groups_of_other_clusters_the_api_lets_through(
    emulator: RunningEmulator,
    make_client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = make_client()
    mine = await client.create_server_group("g", "rma1", managed())
    await client.create_server_group("g", "rma1", managed(cluster="other"))
    # An API that ignores the tag filter: every group comes back.
    state = emulator.state
    monkeypatch.setattr(
        state, "matching_groups", lambda filters: list(state.server_groups.values())
    )
    assert await client.list_server_groups("prod") == [mine]
    assert "returned 4 server groups not tagged k8s-cluster=prod" in caplog.text


async def test_create_keeps_a_caller_chosen_request_tag(make_client: ClientFactory) -> None:
    client = make_client()
    group = await client.create_server_group("g", "rma1", {**managed(), TAG_REQUEST: "mine-1"})
    assert group.tags[TAG_REQUEST] == "mine-1"


async def test_bad_arguments_send_nothing(make_client: ClientFactory) -> None:
    client = make_client()
    with pytest.raises(ValueError, match="name"):
        await client.create_server_group("", "rma1", managed())
    with pytest.raises(ValueError, match="zone"):
        await client.create_server_group("g", "", managed())
    with pytest.raises(ValueError, match="cluster"):
        await client.list_server_groups("")
    with pytest.raises(ValueError, match="uuid"):
        await client.delete_server_group("")
    assert calls_of(client) == []


async def test_a_refused_create_is_typed_and_not_retried(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    with pytest.raises(InvalidRequestError) as caught:
        await client.create_server_group("g", "zrh9", managed())
    assert caught.value.message == "zone: Object with slug=zrh9 does not exist."
    assert caught.value.operation == "create_server_group"
    assert calls_of(client) == [("create_server_group", "400")]


@pytest.mark.parametrize("mode", ["drop", "504"])
async def test_lost_create_response_yields_exactly_one_group(
    emulator: RunningEmulator, make_client: ClientFactory, mode: str
) -> None:
    client = make_client()
    lost = {"count": 1, "mode": mode, "endpoint": "create_server_group"}
    await emulator.admin.set_faults({"lose_create_responses": lost})
    group = await client.create_server_group("g", "lpg1", managed())
    assert [g["uuid"] for g in await all_groups(emulator)][-1] == group.uuid
    assert len(await client.list_server_groups("prod")) == 1
    assert (group.zone, group.tags[TAG_CLUSTER]) == ("lpg1", "prod")
    failed = "error" if mode == "drop" else "504"
    # One POST only: the lookup found the group, nothing was re-sent.
    assert calls_of(client)[:2] == [
        ("create_server_group", failed),
        (GROUP_LOOKUP_OPERATION, "200"),
    ]
    assert client.retries == {"create_server_group": 1, "create_server_group_recovered": 1}


async def test_create_is_resent_only_after_a_lookup_proves_absence(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_retries=2)
    faults = {"error_rate": {"create_server_group": {"rate": 1.0, "status": 500}}}
    await emulator.admin.set_faults(faults)
    with pytest.raises(UnavailableError) as caught:
        await client.create_server_group("g", "rma1", managed())
    assert caught.value.status == 500
    assert calls_of(client) == [
        ("create_server_group", "500"),
        (GROUP_LOOKUP_OPERATION, "200"),
        ("create_server_group", "500"),
        (GROUP_LOOKUP_OPERATION, "200"),
        ("create_server_group", "500"),
        (GROUP_LOOKUP_OPERATION, "200"),
    ]
    assert client.retries == {"create_server_group": 2}
    await emulator.admin.clear_faults()
    assert await client.list_server_groups("prod") == []


async def test_create_429_is_resent_without_lookup(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_retries=2)
    faults = {"rate_limit": {"create_server_group": {"rate": 1.0, "retry_after": 0}}}
    await emulator.admin.set_faults(faults)
    with pytest.raises(RateLimitedError):
        await client.create_server_group("g", "rma1", managed())
    assert calls_of(client) == [("create_server_group", "429")] * 3


async def test_create_against_a_down_api_reports_unknown_outcome(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_retries=1)
    await emulator.admin.set_faults({"down": True})
    with pytest.raises(UnavailableError) as caught:
        await client.create_server_group("g", "rma1", managed())
    assert "outcome unknown, the server group may exist with tag" in caught.value.message
    assert TAG_REQUEST in caught.value.message
    assert caught.value.operation == "create_server_group"
    assert [op for op, _ in calls_of(client)].count("create_server_group") == 1


async def test_delete_404_is_success(emulator: RunningEmulator, make_client: ClientFactory) -> None:
    client = make_client()
    group = await client.create_server_group("g", "rma1", managed())
    await client.delete_server_group(group.uuid)
    await client.delete_server_group(group.uuid)  # 404: already gone
    await client.delete_server_group("00000000-0000-4000-8000-000000000000")
    assert (await emulator.admin.stats())["delete_server_group"] == {"204": 1, "404": 2}
    assert client.retries == {}


async def test_delete_of_a_group_with_servers_is_refused_and_not_retried(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    group = await client.create_server_group("g", "rma1", managed())
    await client.create_server(server("w1", group.uuid))
    with pytest.raises(InvalidRequestError) as caught:
        await client.delete_server_group(group.uuid)
    assert (
        caught.value.message == f"Cannot delete server group {group.uuid}: it still has 1 server."
    )
    assert caught.value.operation == "delete_server_group"
    assert [c for c in calls_of(client) if c[0] == "delete_server_group"] == [
        ("delete_server_group", "400")
    ]
    assert [g.uuid for g in await client.list_server_groups("prod")] == [group.uuid]


async def test_delete_retried_on_503(emulator: RunningEmulator, make_client: ClientFactory) -> None:
    client = make_client(max_retries=10)
    groups = [await client.create_server_group(f"g{i}", "rma1", managed()) for i in range(6)]
    await emulator.admin.set_faults({"error_rate": {"delete_server_group": {"rate": 0.5}}})
    for group in groups:
        await client.delete_server_group(group.uuid)
    await emulator.admin.clear_faults()
    assert await client.list_server_groups("prod") == []
    stats = (await emulator.admin.stats())["delete_server_group"]
    assert stats["503"] == client.retries["delete_server_group"] > 0


async def test_list_retried_on_5xx(emulator: RunningEmulator, make_client: ClientFactory) -> None:
    client = make_client(max_retries=10)
    group = await client.create_server_group("g", "rma1", managed())
    await emulator.admin.set_faults(
        {"error_rate": {"list_server_groups": {"rate": 0.5, "status": 502}}}
    )
    for _ in range(10):
        assert await client.list_server_groups("prod") == [group]
    stats = (await emulator.admin.stats())["list_server_groups"]
    assert stats["200"] == 10
    assert stats["502"] == client.retries["list_server_groups"] > 0


async def test_list_against_a_down_api_is_unavailable_after_retries(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_retries=2)
    await emulator.admin.set_faults({"down": True})
    with pytest.raises(UnavailableError) as caught:
        await client.list_server_groups("prod")
    assert (caught.value.status, caught.value.operation) == (503, "list_server_groups")
    assert calls_of(client) == [("list_server_groups", "503")] * 3


# ---- the refusals of a server create because of its group ---------------------------------------


async def fill(client: CloudscaleClient, group: ServerGroup) -> None:
    for i in range(4):
        await client.create_server(server(f"m{i}", group.uuid))


async def test_a_full_group_refuses_a_member(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    group = await client.create_server_group("g", "rma1", managed())
    await fill(client, group)
    calls_of(client).clear()
    with pytest.raises(ServerGroupFullError) as caught:
        await client.create_server(server("m4", group.uuid))
    assert caught.value.status == 400
    assert caught.value.message == (
        f"server_groups: Server group {group.uuid} is full: it already has 4 servers, the most "
        "an anti-affinity group may hold."
    )
    assert (caught.value.code, caught.value.out_of_resources) == ("SERVER_GROUP_FULL", False)
    assert calls_of(client) == [("create_server", "400")]
    assert len(await emulator.admin.servers()) == 4


async def test_a_deleted_group_refuses_a_member(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    group = await client.create_server_group("g", "rma1", managed())
    async with httpx.AsyncClient(base_url=emulator.admin_url) as admin:  # behind our back
        assert (await admin.delete(f"/server-groups/{group.uuid}")).status_code == 204
    with pytest.raises(ServerGroupGoneError) as caught:
        await client.create_server(server("w1", group.uuid))
    assert caught.value.message == f"server_groups: Object with uuid={group.uuid} does not exist."
    assert (caught.value.code, caught.value.out_of_resources) == ("SERVER_GROUP_NOT_FOUND", False)
    assert calls_of(client)[-1] == ("create_server", "400")
    assert await emulator.admin.servers() == []


async def test_no_distinct_host_is_out_of_resources(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client()
    group = await client.create_server_group("g", "rma1", managed())
    await emulator.admin.set_faults({"host_shortage": {"zones": ["rma1"]}})
    with pytest.raises(HostShortageError) as caught:
        await client.create_server(server("w1", group.uuid))
    assert "No distinct host available in zone rma1" in caught.value.message
    assert (caught.value.code, caught.value.out_of_resources) == ("NO_DISTINCT_HOST", True)
    assert calls_of(client)[-1] == ("create_server", "400")
    # A server outside any group is not refused.
    await client.create_server(server("free"))
    assert [s["name"] for s in await emulator.admin.servers()] == ["free"]


@pytest.mark.parametrize(
    ("faults", "zone", "cls"),
    [
        pytest.param({}, "lpg1", InvalidRequestError, id="group-of-another-zone"),
        pytest.param(
            {"zones_out_of_capacity": ["rma1"], "host_shortage": {}},
            "rma1",
            CapacityError,
            id="zone-out-of-capacity",
        ),
    ],
)
async def test_other_refusals_of_a_member_keep_their_class(
    emulator: RunningEmulator,
    make_client: ClientFactory,
    faults: dict[str, Any],
    zone: str,
    cls: type[CloudError],
) -> None:
    client = make_client()
    group = await client.create_server_group("g", "rma1", managed())
    await emulator.admin.set_faults(faults)
    with pytest.raises(CloudError) as caught:
        await client.create_server(server("w1", group.uuid, zone=zone))
    assert type(caught.value) is cls


# ---- pacing --------------------------------------------------------------------------------------


async def test_group_creates_and_deletes_hold_a_mutation_slot(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(max_concurrent_mutations=2)
    slow = {"fixed_ms": 150}
    await emulator.admin.set_faults({"latency": {"create_server_group": slow}})
    created = await asyncio.gather(
        *(client.create_server_group(f"g{i}", "rma1", managed()) for i in range(5))
    )
    assert (client.mutations.peak, client.mutations.in_flight) == (2, 0)
    await emulator.admin.set_faults({"latency": {"delete_server_group": slow}})
    tasks = [asyncio.create_task(client.delete_server_group(g.uuid)) for g in created]
    seen: list[int] = []
    while not all(task.done() for task in tasks):
        seen.append((await emulator.admin.in_flight()).get("delete_server_group", 0))
    await asyncio.gather(*tasks)
    assert 0 < max(seen) <= 2
    assert await client.list_server_groups("prod") == []


async def test_rate_limit_paces_group_requests(
    emulator: RunningEmulator, make_client: ClientFactory
) -> None:
    client = make_client(requests_per_second=20.0)
    assert client.rate_limiter is not None
    started = time.monotonic()
    await asyncio.gather(*(client.list_server_groups("prod") for _ in range(30)))
    # 20 pass on the burst; the other 10 wait for tokens at 20 per second.
    assert time.monotonic() - started >= 10 / 20.0 - 0.01
    assert client.rate_limiter.waits >= 1
    assert (await emulator.admin.stats())["list_server_groups"] == {"200": 30}
