"""The emulator's /v1/server-groups over real HTTP: create, list by tag, get, patch, delete,
membership through server creates (zone, the limit of 4, leaving by deletion), the
host_shortage fault and the fault middleware on the new endpoints (docs/emulator.md)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from fixtures.emulator import FakeClock, RunningEmulator

from cloudscale_autoscaler.cloud.emulator.catalogue import SERVER_GROUPS
from cloudscale_autoscaler.cloud.emulator.server import Emulator

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
SERVER = {"name": "node-1", "flavor": "flex-4-2", "image": "debian-12"}
UNKNOWN = "00000000-0000-4000-8000-000000000000"
FIXED_RMA1 = "5e0a4c1e-0b7a-4d47-8f63-1a2b3c4d5e01"


async def create_group(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post(
        "/server-groups", json={"name": "g", "type": "anti-affinity", **fields}
    )


async def new_group(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    response = await create_group(client, **fields)
    assert response.status_code == 201, response.text
    group: dict[str, Any] = response.json()
    return group


async def create_server(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/servers", json={**SERVER, **fields})


async def members(client: httpx.AsyncClient, group_uuid: str) -> list[str]:
    response = await client.get(f"/server-groups/{group_uuid}")
    assert response.status_code == 200
    return [s["name"] for s in response.json()["servers"]]


# ---- create, get, list -------------------------------------------------------------------------


async def test_create_answers_201_with_the_whole_group(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    response = await create_group(
        emulator_client, name="workers lpg1", zone="lpg1", tags={"k8s-cluster": "a"}
    )
    assert response.status_code == 201
    assert response.headers["content-type"].startswith("application/json")
    group = response.json()
    assert UUID.match(group["uuid"])
    assert group == {
        "href": f"{emulator.url}/server-groups/{group['uuid']}",
        "uuid": group["uuid"],
        "name": "workers lpg1",
        "type": "anti-affinity",
        "servers": [],
        "zone": {"slug": "lpg1"},
        "tags": {"k8s-cluster": "a"},
    }
    got = await emulator_client.get(f"/server-groups/{group['uuid']}")
    assert got.status_code == 200
    assert got.json() == group
    listed = (await emulator_client.get("/server-groups")).json()
    assert listed[-1] == group  # creation order, after the groups the emulator starts with


async def test_create_without_zone_lands_in_the_default_zone(
    emulator_client: httpx.AsyncClient,
) -> None:
    group = await new_group(emulator_client)
    assert group["zone"] == {"slug": "rma1"}
    assert group["tags"] == {}


async def test_names_need_not_be_unique(emulator_client: httpx.AsyncClient) -> None:
    first = await new_group(emulator_client, name="same")
    second = await new_group(emulator_client, name="same")
    assert first["uuid"] != second["uuid"]


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        ({}, {"name": ["This field is required."], "type": ["This field is required."]}),
        (
            {"name": "g", "type": "affinity"},
            {"type": ['"affinity" is not a valid choice.']},
        ),
        ({"name": "", "type": "anti-affinity"}, {"name": ["This field may not be blank."]}),
        ({"name": None, "type": "anti-affinity"}, {"name": ["This field may not be null."]}),
        (
            {"name": "g", "type": "anti-affinity", "zone": "zrh9"},
            {"zone": ["Object with slug=zrh9 does not exist."]},
        ),
        (
            {"name": "g", "type": "anti-affinity", "tags": {"a": 1}},
            {"tags": ["Expected a dictionary of string keys to string values."]},
        ),
        (
            ["g"],
            {"non_field_errors": ["Invalid data. Expected a dictionary, but got list."]},
        ),
    ],
)
async def test_invalid_create_is_400_with_drf_field_errors(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient, body: Any, errors: Any
) -> None:
    before = len((await emulator_client.get("/server-groups")).json())
    response = await emulator_client.post("/server-groups", json=body)
    assert response.status_code == 400
    assert response.json() == errors
    assert len((await emulator_client.get("/server-groups")).json()) == before
    assert (await emulator.admin.stats())["create_server_group"] == {"400": 1}


async def test_list_filters_by_tag_like_servers(emulator_client: httpx.AsyncClient) -> None:
    a_lpg = await new_group(emulator_client, zone="lpg1", tags={"k8s-cluster": "a", "pool": "w"})
    a_rma = await new_group(emulator_client, tags={"k8s-cluster": "a"})
    b = await new_group(emulator_client, tags={"k8s-cluster": "b", "pool": "w"})

    async def listed(query: str) -> list[str]:
        response = await emulator_client.get(f"/server-groups?{query}")
        assert response.status_code == 200
        return [g["uuid"] for g in response.json()]

    assert await listed("tag:k8s-cluster=a") == [a_lpg["uuid"], a_rma["uuid"]]
    assert await listed("tag%3Ak8s-cluster=b") == [b["uuid"]]
    assert await listed("tag:k8s-cluster=a&tag:pool=w") == [a_lpg["uuid"]]
    assert await listed("tag:pool=") == [a_lpg["uuid"], b["uuid"]]
    assert await listed("tag:k8s-cluster=c") == []
    # Without a filter: every group, the untagged ones the emulator starts with first.
    every = await listed("")
    assert every[: len(SERVER_GROUPS)] == list(SERVER_GROUPS)
    assert every[len(SERVER_GROUPS) :] == [a_lpg["uuid"], a_rma["uuid"], b["uuid"]]


async def test_get_unknown_group_is_404(emulator_client: httpx.AsyncClient) -> None:
    response = await emulator_client.get(f"/server-groups/{UNKNOWN}")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


async def test_group_uuids_are_deterministic_per_seed() -> None:
    body = {"name": "g", "type": "anti-affinity"}
    uuids = []
    for seed in (7, 7, 8):
        async with (
            Emulator(seed=seed) as emu,
            httpx.AsyncClient(base_url=emu.url) as client,
        ):
            uuids.append((await client.post("/server-groups", json=body)).json()["uuid"])
    assert uuids[0] == uuids[1] != uuids[2]


# ---- membership ----------------------------------------------------------------------------


async def test_servers_created_in_a_group_are_its_members(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    group = await new_group(emulator_client, name="sg", zone="lpg1")
    server = (
        await create_server(emulator_client, zone="lpg1", server_groups=[group["uuid"]])
    ).json()
    assert server["server_groups"] == [
        {
            "href": f"{emulator.url}/server-groups/{group['uuid']}",
            "uuid": group["uuid"],
            "name": "sg",
        }
    ]
    shown = (await emulator_client.get(f"/server-groups/{group['uuid']}")).json()
    assert shown["servers"] == [
        {
            "href": f"{emulator.url}/servers/{server['uuid']}",
            "uuid": server["uuid"],
            "name": "node-1",
        }
    ]


async def test_a_group_holds_at_most_four_servers(emulator_client: httpx.AsyncClient) -> None:
    group = (await new_group(emulator_client))["uuid"]
    for i in range(4):
        response = await create_server(emulator_client, name=f"n{i}", server_groups=[group])
        assert response.status_code == 201
    response = await create_server(emulator_client, name="n4", server_groups=[group])
    assert response.status_code == 400
    assert response.json() == {
        "server_groups": [
            f"Server group {group} is full: it already has 4 servers, the most an anti-affinity "
            "group may hold."
        ]
    }
    assert await members(emulator_client, group) == ["n0", "n1", "n2", "n3"]


async def test_a_group_in_another_zone_is_refused(emulator_client: httpx.AsyncClient) -> None:
    group = (await new_group(emulator_client, zone="lpg1"))["uuid"]
    response = await create_server(emulator_client, zone="rma1", server_groups=[group])
    assert response.status_code == 400
    assert response.json() == {
        "server_groups": [f"Server group {group} is in zone lpg1, not in zone rma1."]
    }
    # Without zone the server goes to the default zone, rma1: refused as well.
    response = await create_server(emulator_client, server_groups=[group])
    assert response.status_code == 400
    assert await members(emulator_client, group) == []


async def test_a_deleted_server_leaves_its_group(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    group = (await new_group(emulator_client))["uuid"]
    uuids = []
    for i in range(4):
        response = await create_server(emulator_client, name=f"n{i}", server_groups=[group])
        uuids.append(response.json()["uuid"])
    assert (await emulator_client.delete(f"/servers/{uuids[1]}")).status_code == 204
    assert await members(emulator_client, group) == ["n0", "n2", "n3"]
    # Room again for a fourth.
    response = await create_server(emulator_client, name="n4", server_groups=[group])
    assert response.status_code == 201
    assert await members(emulator_client, group) == ["n0", "n2", "n3", "n4"]
    await emulator.admin.delete_server(uuids[0])  # the admin API's deletions too
    assert await members(emulator_client, group) == ["n2", "n3", "n4"]


async def test_a_server_whose_deletion_lingers_is_still_a_member(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    emulator.state.clock = clock
    await emulator.admin.set_faults({"slow_deletes_seconds": 5})
    group = (await new_group(emulator_client))["uuid"]
    server = (await create_server(emulator_client, server_groups=[group])).json()["uuid"]
    assert (await emulator_client.delete(f"/servers/{server}")).status_code == 204
    assert await members(emulator_client, group) == ["node-1"]
    assert (await emulator_client.delete(f"/server-groups/{group}")).status_code == 400
    clock.advance(5)
    assert await members(emulator_client, group) == []
    assert (await emulator_client.delete(f"/server-groups/{group}")).status_code == 204


# ---- patch and delete ----------------------------------------------------------------------


async def test_patch_renames_and_replaces_tags(emulator_client: httpx.AsyncClient) -> None:
    group = await new_group(emulator_client, name="old", zone="lpg1", tags={"a": "1", "b": "2"})
    ident = group["uuid"]
    server = (await create_server(emulator_client, zone="lpg1", server_groups=[ident])).json()
    # Read once, so the member's JSON is rendered (and cached) before the rename.
    member = (await emulator_client.get(f"/servers/{server['uuid']}")).json()
    assert [g["name"] for g in member["server_groups"]] == ["old"]
    response = await emulator_client.patch(
        f"/server-groups/{ident}",
        json={"name": "new", "tags": {"c": "3"}, "type": "x", "zone": "rma1"},
    )
    assert response.status_code == 204
    assert response.content == b""
    shown = (await emulator_client.get(f"/server-groups/{ident}")).json()
    # Type and zone cannot change: ignored.
    assert (shown["name"], shown["tags"], shown["type"], shown["zone"]) == (
        "new",
        {"c": "3"},
        "anti-affinity",
        {"slug": "lpg1"},
    )
    # The member shows the group's new name (its cached JSON was refreshed).
    member = (await emulator_client.get(f"/servers/{server['uuid']}")).json()
    assert [g["name"] for g in member["server_groups"]] == ["new"]
    listed = (await emulator_client.get("/servers")).json()
    assert [g["name"] for g in listed[0]["server_groups"]] == ["new"]
    assert [g["uuid"] for g in (await emulator_client.get("/server-groups?tag:c=3")).json()] == [
        ident
    ]
    assert (await emulator_client.get("/server-groups?tag:a=1")).json() == []


async def test_patch_errors(emulator_client: httpx.AsyncClient) -> None:
    ident = (await new_group(emulator_client, name="keep"))["uuid"]
    response = await emulator_client.patch(f"/server-groups/{ident}", json={"tags": None})
    assert response.status_code == 400
    assert response.json() == {"tags": ["This field may not be null."]}
    response = await emulator_client.patch(f"/server-groups/{ident}", json={"name": " "})
    assert response.json() == {"name": ["This field may not be blank."]}
    assert (await emulator_client.get(f"/server-groups/{ident}")).json()["name"] == "keep"
    response = await emulator_client.patch(f"/server-groups/{UNKNOWN}", json={"name": "x"})
    assert response.status_code == 404


async def test_delete_an_empty_group(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    ident = (await new_group(emulator_client))["uuid"]
    response = await emulator_client.delete(f"/server-groups/{ident}")
    assert response.status_code == 204
    assert response.content == b""
    assert (await emulator_client.get(f"/server-groups/{ident}")).status_code == 404
    assert ident not in [g["uuid"] for g in (await emulator_client.get("/server-groups")).json()]
    again = await emulator_client.delete(f"/server-groups/{ident}")
    assert (again.status_code, again.json()) == (404, {"detail": "Not found."})
    # A server naming the deleted group is refused on the field.
    response = await create_server(emulator_client, server_groups=[ident])
    assert response.status_code == 400
    assert response.json() == {"server_groups": [f"Object with uuid={ident} does not exist."]}
    assert (await emulator.admin.stats())["delete_server_group"] == {"204": 1, "404": 1}


async def test_deleting_a_group_with_servers_is_refused(
    emulator_client: httpx.AsyncClient,
) -> None:
    ident = (await new_group(emulator_client))["uuid"]
    for i in range(2):
        await create_server(emulator_client, name=f"n{i}", server_groups=[ident])
    response = await emulator_client.delete(f"/server-groups/{ident}")
    assert response.status_code == 400
    assert response.json() == {
        "detail": f"Cannot delete server group {ident}: it still has 2 servers."
    }
    assert await members(emulator_client, ident) == ["n0", "n1"]


async def test_fixed_groups_are_ordinary_and_reset_brings_them_back(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    assert (await emulator_client.get(f"/server-groups/{FIXED_RMA1}")).json()["name"] == (
        "anti-affinity-rma1-a"
    )
    created = (await new_group(emulator_client))["uuid"]
    assert (await emulator_client.delete(f"/server-groups/{FIXED_RMA1}")).status_code == 204
    await emulator.admin.reset()
    listed = (await emulator_client.get("/server-groups")).json()
    assert [(g["uuid"], g["name"], g["zone"]["slug"], g["tags"]) for g in listed] == [
        (g.uuid, g.name, g.zone, {}) for g in SERVER_GROUPS.values()
    ]
    assert created not in [g["uuid"] for g in listed]


async def test_admin_server_groups(emulator: RunningEmulator) -> None:
    async with httpx.AsyncClient(base_url=emulator.admin_url) as admin:
        response = await admin.post(
            "/server-groups", json={"name": "a", "type": "anti-affinity", "zone": "lpg1"}
        )
        assert response.status_code == 201
        ident = response.json()["uuid"]
        listed = (await admin.get("/server-groups")).json()
        assert [g["uuid"] for g in listed] == [*SERVER_GROUPS, ident]
        assert (await admin.delete(f"/server-groups/{ident}")).status_code == 204
        assert (await admin.delete(f"/server-groups/{ident}")).status_code == 404
        response = await admin.post("/server-groups", json={"name": "a"})
        assert response.json() == {"type": ["This field is required."]}
    # The admin API is neither faulted nor counted.
    assert "create_server_group" not in await emulator.admin.stats()


# ---- faults --------------------------------------------------------------------------------


async def test_host_shortage_in_a_zone_refuses_member_creates_only(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    rma = (await new_group(emulator_client))["uuid"]
    lpg = (await new_group(emulator_client, zone="lpg1"))["uuid"]
    await emulator.admin.set_faults({"host_shortage": {"zones": ["rma1"]}})
    for _ in range(2):
        response = await create_server(emulator_client, server_groups=[rma])
        assert response.status_code == 400
        assert response.json() == {
            "detail": f"No distinct host available in zone rma1 for server group {rma}: every "
            "host with room already runs one of its servers."
        }
    assert (await create_server(emulator_client, name="free")).status_code == 201
    response = await create_server(emulator_client, zone="lpg1", server_groups=[lpg])
    assert response.status_code == 201
    assert await members(emulator_client, rma) == []
    assert [s["name"] for s in await emulator.admin.servers()] == ["free", "node-1"]


async def test_host_shortage_count_refuses_the_next_member_creates(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    group = (await new_group(emulator_client))["uuid"]
    faults = await emulator.admin.set_faults({"host_shortage": {"count": 2}})
    assert faults == {"host_shortage": {"count": 2}}
    # Neither invalid requests nor creates outside a group use up the count.
    assert (
        await create_server(emulator_client, name="-x-", server_groups=[group])
    ).status_code == (400)
    assert (await create_server(emulator_client, name="free")).status_code == 201
    assert await emulator.admin.faults() == {"host_shortage": {"count": 2}}
    for _ in range(2):
        response = await create_server(emulator_client, server_groups=[group])
        assert "No distinct host" in response.json()["detail"]
    assert await emulator.admin.faults() == {"host_shortage": {"count": 0}}
    assert (await create_server(emulator_client, server_groups=[group])).status_code == 201


async def test_zone_out_of_capacity_refuses_member_creates_first(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    group = (await new_group(emulator_client))["uuid"]
    await emulator.admin.set_faults(
        {"zones_out_of_capacity": ["rma1"], "host_shortage": {"zones": ["rma1"], "count": 1}}
    )
    response = await create_server(emulator_client, server_groups=[group])
    assert response.json() == {"detail": "Insufficient capacity in zone rma1 for flavor flex-4-2."}
    # The shortage was not reached, so its count is untouched.
    assert (await emulator.admin.faults())["host_shortage"] == {"zones": ["rma1"], "count": 1}


@pytest.mark.parametrize(
    ("faults", "key"),
    [
        ({"host_shortage": {"zones": ["zrh9"]}}, "host_shortage.zones"),
        ({"host_shortage": {"zones": "rma1"}}, "host_shortage.zones"),
        ({"host_shortage": {"count": -1}}, "host_shortage.count"),
        ({"host_shortage": {"hosts": 1}}, "host_shortage.hosts"),
        ({"host_shortage": ["rma1"]}, "host_shortage"),
        ({"error_rate": {"create_server_groups": {"rate": 1}}}, "error_rate.create_server_groups"),
        (
            {"lose_create_responses": {"endpoint": "delete_server_group"}},
            "lose_create_responses.endpoint",
        ),
    ],
)
async def test_bad_host_shortage_bodies_are_400_naming_the_key(
    emulator: RunningEmulator, faults: dict[str, Any], key: str
) -> None:
    async with httpx.AsyncClient(base_url=emulator.admin_url) as admin:
        response = await admin.put("/faults", json=faults)
    assert response.status_code == 400
    assert list(response.json()) == [key]


@pytest.mark.parametrize("mode", ["drop", "504"])
async def test_lost_server_group_create_responses(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient, mode: str
) -> None:
    lost = {"count": 1, "mode": mode, "endpoint": "create_server_group"}
    assert await emulator.admin.set_faults({"lose_create_responses": lost}) == {
        "lose_create_responses": lost
    }
    # Server creates are not hit by it.
    assert (await create_server(emulator_client)).status_code == 201
    if mode == "drop":
        with pytest.raises(httpx.RemoteProtocolError):
            await create_group(emulator_client, name="lost", tags={"k": "v"})
    else:
        response = await create_group(emulator_client, name="lost", tags={"k": "v"})
        assert response.status_code == 504
        assert response.headers["content-type"].startswith("text/html")
    # Created all the same.
    [group] = (await emulator_client.get("/server-groups?tag:k=v")).json()
    assert group["name"] == "lost"
    assert (await emulator.admin.faults())["lose_create_responses"]["count"] == 0
    assert (await create_group(emulator_client)).status_code == 201
    assert (await emulator.admin.stats())["create_server_group"] == {
        ("dropped" if mode == "drop" else "504"): 1,
        "201": 1,
    }


GROUP_CALLS = [
    ("create_server_group", "POST", "/server-groups", {"name": "g", "type": "anti-affinity"}),
    ("get_server_group", "GET", f"/server-groups/{FIXED_RMA1}", None),
    ("patch_server_group", "PATCH", f"/server-groups/{FIXED_RMA1}", {"name": "x"}),
    ("delete_server_group", "DELETE", f"/server-groups/{FIXED_RMA1}", None),
    ("list_server_groups", "GET", "/server-groups", None),
]


@pytest.mark.parametrize(("endpoint", "method", "path", "body"), GROUP_CALLS)
async def test_faults_apply_to_the_server_group_endpoints(
    emulator: RunningEmulator,
    emulator_client: httpx.AsyncClient,
    endpoint: str,
    method: str,
    path: str,
    body: Any,
) -> None:
    await emulator.admin.set_faults({"error_rate": {endpoint: {"rate": 1.0, "status": 502}}})
    response = await emulator_client.request(method, path, json=body)
    assert response.status_code == 502
    assert response.json() == {"detail": "Bad gateway."}
    # The other server-group endpoints are not affected, and nothing was changed.
    await emulator.admin.clear_faults()
    async with httpx.AsyncClient(base_url=emulator.admin_url) as admin:
        groups = (await admin.get("/server-groups")).json()
    assert [(g["uuid"], g["name"]) for g in groups] == [
        (g.uuid, g.name) for g in SERVER_GROUPS.values()
    ]
    stats = await emulator.admin.stats()
    assert stats[endpoint] == {"502": 1}
    await emulator.admin.set_faults({"rate_limit": {endpoint: {"rate": 1.0, "retry_after": 3}}})
    response = await emulator_client.request(method, path, json=body)
    assert (response.status_code, response.headers["Retry-After"]) == (429, "3")


@pytest.mark.parametrize(("endpoint", "method", "path", "body"), GROUP_CALLS)
async def test_server_group_endpoints_need_the_token(
    emulator: RunningEmulator, endpoint: str, method: str, path: str, body: Any
) -> None:
    async with httpx.AsyncClient(base_url=emulator.url) as anonymous:
        response = await anonymous.request(method, path, json=body)
    assert response.status_code == 401
    assert response.json() == {"detail": "Authentication credentials were not provided."}
    assert (await emulator.admin.stats())[endpoint] == {"401": 1}
