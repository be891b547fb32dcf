"""Fault injection over real HTTP: each fault kind, the fault admin API, and determinism."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fixtures.emulator import AUTH_HEADERS, TOKEN, EmulatorAdmin, FakeClock, RunningEmulator

from cloudscale_autoscaler.cloud.emulator.faults import parse_faults
from cloudscale_autoscaler.cloud.emulator.server import Emulator

CREATE = {"name": "node-1", "flavor": "flex-4-2", "image": "debian-12"}
ALL_API_CALLS = [
    ("GET", "/servers"),
    ("POST", "/servers"),
    ("GET", "/servers/2d7b4a4e-0000-4000-8000-000000000000"),
    ("DELETE", "/servers/2d7b4a4e-0000-4000-8000-000000000000"),
    ("PATCH", "/servers/2d7b4a4e-0000-4000-8000-000000000000"),
    ("GET", "/flavors"),
    ("GET", "/images"),
    ("GET", "/regions"),
    ("GET", "/server-groups"),
]


async def create(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/servers", json={**CREATE, **fields})


# ---- per-endpoint faults -------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_error_rate_one_fails_every_request_with_a_drf_body(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient, status: int
) -> None:
    await emulator.admin.set_faults({"error_rate": {"*": {"rate": 1.0, "status": status}}})
    for method, path in ALL_API_CALLS:
        response = await emulator_client.request(method, path, json=CREATE)
        assert response.status_code == status, (method, path)
        assert isinstance(response.json()["detail"], str)
    # Failed creates create nothing.
    assert await emulator.admin.servers() == []


async def test_error_rate_per_endpoint_overrides_the_wildcard(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults(
        {"error_rate": {"*": {"rate": 1.0, "status": 502}, "list_flavors": {"rate": 0.0}}}
    )
    assert (await emulator_client.get("/flavors")).status_code == 200
    assert (await emulator_client.get("/images")).status_code == 502


async def test_error_rate_half_mixes_failures_and_successes(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"error_rate": {"list_servers": {"rate": 0.5}}})
    statuses = [(await emulator_client.get("/servers")).status_code for _ in range(40)]
    assert set(statuses) == {200, 503}
    assert (await emulator_client.get("/regions")).status_code == 200
    stats = await emulator.admin.stats()
    assert stats["list_servers"] == {
        "200": statuses.count(200),
        "503": statuses.count(503),
    }


async def test_rate_limit_answers_429_with_retry_after(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults(
        {"rate_limit": {"create_server": {"rate": 1.0, "retry_after": 3}}}
    )
    response = await create(emulator_client)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.json() == {"detail": "Request was throttled. Expected available in 3 seconds."}
    assert (await emulator_client.get("/servers")).status_code == 200
    assert await emulator.admin.servers() == []


async def wait_in_flight(admin: EmulatorAdmin, endpoint: str, count: int) -> None:
    for _ in range(1000):
        if (await admin.in_flight()).get(endpoint, 0) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never {count} {endpoint} requests in flight")


async def test_latency_delays_only_its_endpoint(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"latency": {"list_flavors": {"fixed_ms": 600_000}}})
    slow = asyncio.create_task(emulator_client.get("/flavors"))
    await wait_in_flight(emulator.admin, "list_flavors", 1)
    fast = await emulator_client.get("/regions")
    assert fast.status_code == 200
    assert not slow.done()
    await emulator.admin.clear_faults()  # releases the held request (see below)
    assert (await slow).status_code == 200


async def test_clearing_faults_releases_requests_held_by_latency(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    admin = emulator.admin
    await admin.set_faults({"latency": {"list_flavors": {"fixed_ms": 600_000}}})
    held = asyncio.create_task(emulator_client.get("/flavors"))
    await wait_in_flight(admin, "list_flavors", 1)
    # A new fault set that still delays the endpoint keeps holding it...
    await admin.set_faults({"latency": {"*": {"fixed_ms": 1}, "list_flavors": {"fixed_ms": 5}}})
    assert (await emulator_client.get("/regions")).status_code == 200
    assert await admin.in_flight() == {"list_flavors": 1}
    assert not held.done()
    # ...one without latency for it lets it go (long before the 10 minutes).
    await admin.set_faults({"error_rate": {"list_images": {"rate": 1.0}}})
    response = await asyncio.wait_for(held, 60)
    assert response.status_code == 200
    assert await admin.in_flight() == {}


def test_latency_is_fixed_plus_seeded_jitter() -> None:
    emu = Emulator(seed=5)
    faults = parse_faults({"latency": {"*": {"fixed_ms": 100, "jitter_ms": 50}}}, ("rma1",))
    draws = [faults.latency_seconds("get_server", emu.state.rng) for _ in range(50)]
    assert all(0.1 <= d <= 0.15 for d in draws)
    assert len(set(draws)) == 50
    again = Emulator(seed=5)
    assert draws == [faults.latency_seconds("get_server", again.state.rng) for _ in range(50)]


async def test_auth_is_checked_before_error_faults(
    emulator: RunningEmulator,
) -> None:
    await emulator.admin.set_faults({"error_rate": {"*": {"rate": 1.0}}})
    async with httpx.AsyncClient(base_url=emulator.url) as anonymous:
        assert (await anonymous.get("/servers")).status_code == 401


# ---- create faults -------------------------------------------------------------------------


async def test_quota_max_servers_counts_all_servers(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.create_server("untagged")  # admin: bypasses quota, still counts
    await emulator.admin.set_faults({"quota": {"max_servers": 2}})
    assert (await create(emulator_client, tags={"k8s-cluster": "a"})).status_code == 201
    refused = await create(emulator_client, name="node-2")
    assert refused.status_code == 400
    assert refused.json() == {"detail": "Quota exceeded: servers (limit 2, in use 2)."}
    assert len(await emulator.admin.servers()) == 2
    await emulator.admin.create_server("over-quota")  # admin still may
    assert len(await emulator.admin.servers()) == 3


async def test_quota_max_vcpus(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"quota": {"max_vcpus": 10}})
    assert (await create(emulator_client, flavor="flex-16-8")).status_code == 201
    refused = await create(emulator_client, flavor="flex-8-4")
    assert refused.status_code == 400
    assert refused.json()["detail"] == ("Quota exceeded: vCPUs (limit 10, in use 8, requested 4).")
    assert (await create(emulator_client, flavor="flex-4-2")).status_code == 201


@pytest.mark.parametrize(
    ("kind", "status", "body"),
    [
        ("quota", 400, {"detail": "Quota exceeded: emulated failure (fail_next_creates)."}),
        ("capacity", 400, {"detail": "Insufficient capacity in zone lpg1 for flavor flex-4-2."}),
        ("server_error", 500, {"detail": "A server error occurred."}),
        ("invalid", 400, {"name": ["Emulated invalid request (fail_next_creates)."]}),
    ],
)
async def test_fail_next_creates(
    emulator: RunningEmulator,
    emulator_client: httpx.AsyncClient,
    kind: str,
    status: int,
    body: dict[str, Any],
) -> None:
    await emulator.admin.set_faults({"fail_next_creates": {"count": 2, "kind": kind}})
    for _ in range(2):
        response = await create(emulator_client, zone="lpg1")
        assert (response.status_code, response.json()) == (status, body)
    assert await emulator.admin.servers() == []
    assert (await emulator.admin.faults())["fail_next_creates"] == {"count": 0, "kind": kind}
    assert (await create(emulator_client, zone="lpg1")).status_code == 201


async def test_fail_next_creates_does_not_count_invalid_requests(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"fail_next_creates": {"count": 1, "kind": "quota"}})
    assert (await create(emulator_client, flavor="nope")).json() == {
        "flavor": ["Object with slug=nope does not exist."]
    }
    assert "Quota" in (await create(emulator_client)).json()["detail"]


@pytest.mark.parametrize("status", [500, 409])
async def test_fail_next_deletes_refuses_deletes_of_existing_servers_only(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient, status: int
) -> None:
    await emulator.admin.set_faults({"fail_next_deletes": {"count": 2, "status": status}})
    uuid = (await create(emulator_client)).json()["uuid"]
    # An unknown server is a 404 as ever, and does not use up the count.
    assert (await emulator_client.delete("/servers/" + "0" * 32)).status_code == 404
    for _ in range(2):
        refused = await emulator_client.delete(f"/servers/{uuid}")
        assert refused.status_code == status and "detail" in refused.json()
    assert [s["uuid"] for s in await emulator.admin.servers()] == [uuid]
    assert (await emulator.admin.faults())["fail_next_deletes"] == {"count": 0, "status": status}
    assert (await emulator_client.delete(f"/servers/{uuid}")).status_code == 204
    assert await emulator.admin.servers() == []


async def test_fail_next_deletes_status_is_checked(emulator: RunningEmulator) -> None:
    async with httpx.AsyncClient(base_url=emulator.admin_url) as admin:
        body = {"fail_next_deletes": {"count": 1, "status": 200}}
        response = await admin.put("/faults", json=body)
    assert response.status_code == 400
    assert response.json() == {
        "fail_next_deletes.status": ["got 200, expected an integer between 400 and 599"]
    }


async def test_zones_out_of_capacity(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"zones_out_of_capacity": ["rma1"]})
    refused = await create(emulator_client, zone="rma1", flavor="plus-16-4")
    assert refused.status_code == 400
    assert refused.json() == {"detail": "Insufficient capacity in zone rma1 for flavor plus-16-4."}
    # No zone given: the default zone, rma1.
    assert "rma1" in (await create(emulator_client)).json()["detail"]
    assert (await create(emulator_client, zone="lpg1")).status_code == 201
    assert len(await emulator.admin.servers()) == 1


async def test_lost_create_response_drop_closes_the_connection_after_creating(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"lose_create_responses": {"count": 1, "mode": "drop"}})
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        await create(emulator_client, tags={"k8s-autoscaler-request": "r1"})
    [server] = await emulator.admin.servers()
    assert server["tags"] == {"k8s-autoscaler-request": "r1"}
    found = await emulator_client.get("/servers", params={"tag:k8s-autoscaler-request": "r1"})
    assert [s["uuid"] for s in found.json()] == [server["uuid"]]
    assert (await create(emulator_client, name="node-2")).status_code == 201
    assert (await emulator.admin.stats())["create_server"] == {"dropped": 1, "201": 1}


async def test_lost_create_response_504_after_creating(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"lose_create_responses": {"count": 1, "mode": "504"}})
    response = await create(emulator_client)
    assert response.status_code == 504
    assert response.headers["content-type"].startswith("text/html")
    assert "Gateway Time-out" in response.text
    assert len(await emulator.admin.servers()) == 1
    assert (await create(emulator_client, name="node-2")).status_code == 201


async def test_slow_deletes_keep_the_server_listed_as_changing() -> None:
    clock = FakeClock()
    async with Emulator(token=None) as emu, httpx.AsyncClient(base_url=emu.url) as client:
        emu.state.clock = clock
        emu.state.faults.slow_deletes_seconds = 5.0
        uuid = (await create(client, tags={"k8s-cluster": "a"})).json()["uuid"]
        assert (await client.delete(f"/servers/{uuid}")).status_code == 204
        clock.advance(4.9)
        listed = (await client.get("/servers", params={"tag:k8s-cluster": "a"})).json()
        assert [(s["uuid"], s["status"]) for s in listed] == [(uuid, "changing")]
        assert (await client.get(f"/servers/{uuid}")).json()["status"] == "changing"
        # A repeated delete while it lingers succeeds and is not logged twice.
        assert (await client.delete(f"/servers/{uuid}")).status_code == 204
        assert len(emu.state.deletions) == 1
        clock.advance(0.1)
        assert (await client.get("/servers")).json() == []
        assert (await client.get(f"/servers/{uuid}")).status_code == 404


async def test_slow_deletes_via_the_fault_api(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"slow_deletes_seconds": 600})
    uuid = (await create(emulator_client)).json()["uuid"]
    assert (await emulator_client.delete(f"/servers/{uuid}")).status_code == 204
    [server] = (await emulator_client.get("/servers")).json()
    assert (server["uuid"], server["status"]) == (uuid, "changing")
    [entry] = await emulator.admin.deletions()
    assert (entry["uuid"], entry["by"]) == (uuid, "api")


# ---- down ----------------------------------------------------------------------------------


async def test_down_503_fails_every_api_request_but_not_the_admin_api(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"down": True})
    for method, path in ALL_API_CALLS:
        response = await emulator_client.request(method, path, json=CREATE)
        assert response.status_code == 503, (method, path)
        assert response.json() == {"detail": "Service temporarily unavailable, try again later."}
    assert await emulator.admin.servers() == []
    await emulator.admin.clear_faults()
    assert (await emulator_client.get("/servers")).status_code == 200


async def test_down_reset_resets_connections(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.set_faults({"down": "reset"})
    for method, path in ALL_API_CALLS[:2]:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            await emulator_client.request(method, path, json=CREATE)
    assert (await emulator.admin.stats())["list_servers"] == {"reset": 1}
    await emulator.admin.set_faults({"down": False})
    assert (await emulator_client.get("/servers")).status_code == 200


# ---- the fault admin API -------------------------------------------------------------------


FULL_FAULTS: dict[str, Any] = {
    "latency": {"get_server": {"fixed_ms": 100.0, "jitter_ms": 50.0}},
    "error_rate": {"*": {"rate": 0.3, "status": 503}},
    "rate_limit": {"list_servers": {"rate": 0.5, "retry_after": 1}},
    "quota": {"max_servers": 10, "max_vcpus": 100},
    "fail_next_creates": {"count": 2, "kind": "capacity"},
    "zones_out_of_capacity": ["rma1"],
    "lose_create_responses": {"count": 1, "mode": "504"},
    "slow_deletes_seconds": 5.0,
    "down": True,
}


async def test_faults_put_get_delete_round_trip(emulator_admin: EmulatorAdmin) -> None:
    assert await emulator_admin.faults() == {}
    assert await emulator_admin.set_faults(FULL_FAULTS) == FULL_FAULTS
    assert await emulator_admin.faults() == FULL_FAULTS
    # PUT replaces the whole set.
    assert await emulator_admin.set_faults({"slow_deletes_seconds": 1}) == {
        "slow_deletes_seconds": 1.0
    }
    await emulator_admin.clear_faults()
    assert await emulator_admin.faults() == {}


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ([], "faults"),
        ({"explode": True}, "explode"),
        ({"latency": {"list_everything": {"fixed_ms": 1}}}, "latency.list_everything"),
        ({"latency": {"*": {"fixed_ms": -1}}}, "latency.*.fixed_ms"),
        ({"latency": {"*": {"fixed": 1}}}, "latency.*.fixed"),
        ({"error_rate": {"*": {"rate": 1.5}}}, "error_rate.*.rate"),
        ({"error_rate": {"*": {"rate": 0.5, "status": 200}}}, "error_rate.*.status"),
        ({"error_rate": {"*": {}}}, "error_rate.*.rate"),
        ({"rate_limit": {"*": {"rate": "often"}}}, "rate_limit.*.rate"),
        ({"rate_limit": {"*": {"rate": 1, "retry_after": 1.5}}}, "rate_limit.*.retry_after"),
        ({"quota": {"max_servers": -1}}, "quota.max_servers"),
        ({"quota": {"max_cpus": 1}}, "quota.max_cpus"),
        ({"fail_next_creates": {"count": 1, "kind": "boom"}}, "fail_next_creates.kind"),
        ({"fail_next_creates": {"count": True}}, "fail_next_creates.count"),
        ({"zones_out_of_capacity": ["zrh1"]}, "zones_out_of_capacity"),
        ({"zones_out_of_capacity": "rma1"}, "zones_out_of_capacity"),
        ({"lose_create_responses": {"mode": "vanish"}}, "lose_create_responses.mode"),
        ({"slow_deletes_seconds": "5"}, "slow_deletes_seconds"),
        ({"down": "sometimes"}, "down"),
    ],
)
async def test_bad_fault_bodies_are_400_naming_the_key(
    emulator: RunningEmulator, body: Any, path: str
) -> None:
    await emulator.admin.set_faults({"down": True})
    async with httpx.AsyncClient() as client:
        response = await client.put(f"{emulator.admin_url}/faults", json=body)
    assert response.status_code == 400
    [(key, [message])] = response.json().items()
    assert key == path
    assert message
    # A rejected body leaves the previous fault set in place.
    assert await emulator.admin.faults() == {"down": True}


async def test_faults_put_rejects_non_json(emulator: RunningEmulator) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.put(f"{emulator.admin_url}/faults", content=b"down")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("JSON parse error")


# ---- determinism ---------------------------------------------------------------------------

RANDOM_FAULTS = {
    "error_rate": {"*": {"rate": 0.3, "status": 502}},
    "rate_limit": {"list_servers": {"rate": 0.3, "retry_after": 0}},
    "latency": {"*": {"fixed_ms": 0, "jitter_ms": 2}},
}


async def outcome_sequence(emu: Emulator) -> list[int]:
    async with httpx.AsyncClient(base_url=emu.url, headers=AUTH_HEADERS) as client:
        statuses = []
        for i in range(30):
            statuses.append((await client.get("/servers")).status_code)
            statuses.append((await create(client, name=f"n{i}")).status_code)
        return statuses


async def faulty_emulator_sequence(seed: int) -> list[int]:
    async with Emulator(token=TOKEN, seed=seed) as emu:
        async with httpx.AsyncClient() as admin:
            await admin.put(f"{emu.admin_url}/faults", json=RANDOM_FAULTS)
        return await outcome_sequence(emu)


async def test_same_seed_same_outcomes() -> None:
    first = await faulty_emulator_sequence(42)
    assert first == await faulty_emulator_sequence(42)
    assert {200, 201, 429, 502} <= set(first)
    assert first != await faulty_emulator_sequence(43)


async def test_reset_rewinds_the_fault_rng(emulator: RunningEmulator) -> None:
    await emulator.admin.set_faults(RANDOM_FAULTS)
    first = await outcome_sequence(emulator)
    await emulator.admin.reset()
    await emulator.admin.set_faults(RANDOM_FAULTS)
    assert await outcome_sequence(emulator) == first
