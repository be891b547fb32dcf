"""The emulator's REST API over real HTTP on 127.0.0.1: every status code and body the docs
promise (docs/emulator.md), tag filtering, the catalogue, the admin API and 5,000 servers."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from typing import Any

import httpx
import pytest
from fixtures.emulator import EmulatorAdmin, FakeClock, RunningEmulator

from cloudscale_autoscaler.cloud.emulator.catalogue import FLAVORS, SERVER_GROUPS
from cloudscale_autoscaler.cloud.emulator.server import Emulator, parse_listen

CREATE = {"name": "node-1", "flavor": "flex-4-2", "image": "debian-12"}
ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
RMA1_GROUP = next(g.uuid for g in SERVER_GROUPS.values() if g.zone == "rma1")
LPG1_GROUP = next(g.uuid for g in SERVER_GROUPS.values() if g.zone == "lpg1")


async def create(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/servers", json={**CREATE, **fields})


# ---- create and read -----------------------------------------------------------------------


async def test_create_answers_201_with_the_full_server_object_changing(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    response = await create(
        emulator_client,
        zone="lpg1",
        volume_size_gb=50,
        tags={"k8s-cluster": "a"},
        ssh_keys=["ssh-ed25519 AAAA user"],
        server_groups=[LPG1_GROUP],
    )
    assert response.status_code == 201
    assert response.headers["content-type"].startswith("application/json")
    server = response.json()
    assert server["status"] == "changing"
    assert UUID.match(server["uuid"])
    assert server["href"] == f"{emulator.url}/servers/{server['uuid']}"
    assert server["name"] == "node-1"
    assert ISO_Z.match(server["created_at"])
    assert server["zone"] == {"slug": "lpg1"}
    assert server["flavor"] == {
        "slug": "flex-4-2",
        "name": "Flex-4-2",
        "vcpu_count": 2,
        "memory_gb": 4,
    }
    assert server["image"] == {
        "slug": "debian-12",
        "name": "Debian 12",
        "operating_system": "Debian",
        "default_username": "debian",
    }
    [volume] = server["volumes"]
    assert (volume["type"], volume["size_gb"], volume["name"]) == ("ssd", 50, "node-1-root")
    assert re.match(r"^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", volume["uuid"])
    assert volume["href"].endswith(f"/volumes/{volume['uuid']}")
    assert server["server_groups"] == [
        {
            "href": f"{emulator.url}/server-groups/{LPG1_GROUP}",
            "uuid": LPG1_GROUP,
            "name": SERVER_GROUPS[LPG1_GROUP].name,
        }
    ]
    assert server["anti_affinity_with"] == []
    assert server["tags"] == {"k8s-cluster": "a"}
    # Not booted yet: no host keys.
    assert server["ssh_fingerprints"] == [] and server["ssh_host_keys"] == []


async def test_boot_seconds_zero_is_running_on_first_read(
    emulator_client: httpx.AsyncClient,
) -> None:
    created = (await create(emulator_client)).json()
    assert created["status"] == "changing"
    fetched = (await emulator_client.get(f"/servers/{created['uuid']}")).json()
    assert fetched["status"] == "running"
    assert fetched["ssh_fingerprints"][0].startswith("ssh-ed25519 SHA256:")
    assert fetched["ssh_host_keys"][0].startswith("ssh-ed25519 AAAA")
    listed = (await emulator_client.get("/servers")).json()
    assert [s["status"] for s in listed] == ["running"]


async def test_server_turns_running_after_boot_seconds() -> None:
    clock = FakeClock()
    async with Emulator(token=None, boot_seconds=30.0) as emu:
        emu.state.clock = clock
        async with httpx.AsyncClient(base_url=emu.url) as client:
            uuid = (await create(client)).json()["uuid"]
            clock.advance(29.9)
            assert (await client.get(f"/servers/{uuid}")).json()["status"] == "changing"
            clock.advance(0.1)
            assert (await client.get(f"/servers/{uuid}")).json()["status"] == "running"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, [("public", [4, 6])]),
        ({"use_ipv6": False}, [("public", [4])]),
        ({"use_private_network": True}, [("public", [4, 6]), ("private", [4])]),
        ({"use_public_network": False, "use_private_network": True}, [("private", [4])]),
        ({"use_public_network": False}, []),
    ],
)
async def test_interfaces_follow_the_network_flags(
    emulator_client: httpx.AsyncClient,
    flags: dict[str, bool],
    expected: list[tuple[str, list[int]]],
) -> None:
    server = (await create(emulator_client, **flags)).json()
    got = [(i["type"], [a["version"] for a in i["addresses"]]) for i in server["interfaces"]]
    assert got == expected
    for interface in server["interfaces"]:
        assert set(interface["network"]) == {"href", "uuid", "name"}
        for address in interface["addresses"]:
            assert {"address", "prefix_length", "gateway", "subnet"} <= set(address)


async def test_server_uuids_are_deterministic_per_seed() -> None:
    async def uuids(seed: int) -> list[str]:
        async with Emulator(seed=seed) as emu, httpx.AsyncClient(base_url=emu.url) as client:
            return [(await create(client)).json()["uuid"] for _ in range(3)]

    first = await uuids(7)
    assert first == await uuids(7)
    assert len(set(first)) == 3
    assert first != await uuids(8)


# ---- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "Authentication credentials were not provided."),
        ({"Authorization": "Token test-token"}, "Authentication credentials were not provided."),
        ({"Authorization": "Bearer wrong"}, "Invalid token."),
        ({"Authorization": "Bearer"}, "Invalid token."),
    ],
)
async def test_bad_or_missing_token_is_401(
    emulator: RunningEmulator, headers: dict[str, str], message: str
) -> None:
    async with httpx.AsyncClient(base_url=emulator.url, headers=headers) as client:
        for response in (await client.get("/servers"), await client.post("/servers", json=CREATE)):
            assert response.status_code == 401
            assert response.json() == {"detail": message}
            assert response.headers["www-authenticate"].startswith("Bearer")
    assert await emulator.admin.servers() == []


async def test_any_token_or_none_is_accepted_without_a_configured_token() -> None:
    async with Emulator(token=None) as emu:
        for headers in ({}, {"Authorization": "Bearer whatever"}):
            async with httpx.AsyncClient(base_url=emu.url, headers=headers) as client:
                assert (await client.get("/servers")).status_code == 200


async def test_admin_api_needs_no_token(emulator: RunningEmulator) -> None:
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{emulator.admin_url}/servers")).status_code == 200


# ---- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        ({"flavor": "flex-4-2", "image": "debian-12"}, {"name": ["This field is required."]}),
        ({"name": "a", "image": "debian-12"}, {"flavor": ["This field is required."]}),
        ({"name": "a", "flavor": "flex-4-2"}, {"image": ["This field is required."]}),
        ({}, {k: ["This field is required."] for k in ("name", "flavor", "image")}),
        ({**CREATE, "name": ""}, {"name": ["This field may not be blank."]}),
        ({**CREATE, "name": None}, {"name": ["This field may not be null."]}),
        ({**CREATE, "name": 5}, {"name": ["Not a valid string."]}),
        (
            {**CREATE, "flavor": "flex-99-1"},
            {"flavor": ["Object with slug=flex-99-1 does not exist."]},
        ),
        (
            {**CREATE, "image": "windows-95"},
            {"image": ["Object with slug=windows-95 does not exist."]},
        ),
        ({**CREATE, "zone": "zrh9"}, {"zone": ["Object with slug=zrh9 does not exist."]}),
        ({**CREATE, "ssh_keys": None}, {"ssh_keys": ["This field may not be null."]}),
        (
            {**CREATE, "ssh_keys": "ssh-ed25519 AAAA"},
            {"ssh_keys": ['Expected a list of items but got type "str".']},
        ),
        (
            {**CREATE, "volume_size_gb": 9},
            {"volume_size_gb": ["Ensure this value is greater than or equal to 10."]},
        ),
        ({**CREATE, "volume_size_gb": "50"}, {"volume_size_gb": ["A valid integer is required."]}),
        ({**CREATE, "use_ipv6": "yes"}, {"use_ipv6": ["Must be a valid boolean."]}),
        (
            {**CREATE, "tags": {"a": 1}},
            {"tags": ["Expected a dictionary of string keys to string values."]},
        ),
        ({**CREATE, "tags": None}, {"tags": ["This field may not be null."]}),
        ({**CREATE, "user_data": 42}, {"user_data": ["Not a valid string."]}),
        (
            {**CREATE, "flavor": "gpu2-128-16-1-200", "zone": "lpg1"},
            {"flavor": ["Flavor gpu2-128-16-1-200 is not available in zone lpg1."]},
        ),
        # No zone: the default zone (rma1) applies.
        (
            {**CREATE, "image": "ubuntu-20.04", "zone": "lpg1"},
            {"image": ["Image ubuntu-20.04 is not available in zone lpg1."]},
        ),
        (
            {**CREATE, "server_groups": ["00000000-0000-4000-8000-000000000000"]},
            {
                "server_groups": [
                    "Object with uuid=00000000-0000-4000-8000-000000000000 does not exist."
                ]
            },
        ),
        (
            {**CREATE, "zone": "rma1", "server_groups": [LPG1_GROUP]},
            {"server_groups": [f"Server group {LPG1_GROUP} is in zone lpg1, not in zone rma1."]},
        ),
        ([CREATE], {"non_field_errors": ["Invalid data. Expected a dictionary, but got list."]}),
    ],
)
async def test_invalid_create_is_400_with_drf_field_errors(
    emulator: RunningEmulator,
    emulator_client: httpx.AsyncClient,
    body: Any,
    errors: dict[str, list[str]],
) -> None:
    response = await emulator_client.post("/servers", json=body)
    assert response.status_code == 400
    assert response.json() == errors
    assert await emulator.admin.servers() == []


async def test_every_invalid_field_is_reported_at_once(
    emulator_client: httpx.AsyncClient,
) -> None:
    body = {
        "name": "bad_name",
        "flavor": "nope",
        "image": "debian-12",
        "ssh_keys": None,
        "volume_size_gb": 1,
    }
    response = await emulator_client.post("/servers", json=body)
    assert response.status_code == 400
    assert set(response.json()) == {"name", "flavor", "ssh_keys", "volume_size_gb"}


@pytest.mark.parametrize(
    "name",
    [
        "-node",
        "node-",
        "no_de",
        "node..example",
        ".node",
        "node.",
        "a" * 64,
        ".".join(["a" * 63] * 4) + "a",
        "nöde",
        "node 1",
    ],
)
async def test_invalid_host_names_are_rejected(
    emulator_client: httpx.AsyncClient, name: str
) -> None:
    response = await create(emulator_client, name=name)
    assert response.status_code == 400
    [message] = response.json()["name"]
    assert "253 characters" in message or repr(name) in message


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "node-1",
        "1node",
        "worker-7.k8s.example.com",
        "a" * 63,
        ".".join(["a" * 63] * 3 + ["a" * 61]),
    ],
)
async def test_valid_host_names_and_fqdns_are_accepted(
    emulator_client: httpx.AsyncClient, name: str
) -> None:
    response = await create(emulator_client, name=name)
    assert response.status_code == 201, response.text
    assert response.json()["name"] == name


@pytest.mark.parametrize("body", [b"not json", b"", b'{"name": '])
async def test_non_json_body_is_400(emulator_client: httpx.AsyncClient, body: bytes) -> None:
    response = await emulator_client.post(
        "/servers", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("JSON parse error - ")


async def test_oversized_body_is_413_json(emulator_client: httpx.AsyncClient) -> None:
    response = await create(emulator_client, user_data="x" * (2 * 1024 * 1024))
    assert response.status_code == 413
    assert isinstance(response.json()["detail"], str)


async def test_anti_affinity_group_holds_at_most_four_servers(
    emulator_client: httpx.AsyncClient,
) -> None:
    for i in range(4):
        response = await create(emulator_client, name=f"n{i}", server_groups=[RMA1_GROUP])
        assert response.status_code == 201
    response = await create(emulator_client, name="n4", server_groups=[RMA1_GROUP])
    assert response.status_code == 400
    assert "already has 4 servers" in response.json()["server_groups"][0]
    groups = (await emulator_client.get("/server-groups")).json()
    [group] = [g for g in groups if g["uuid"] == RMA1_GROUP]
    assert [s["name"] for s in group["servers"]] == ["n0", "n1", "n2", "n3"]


# ---- get, delete, patch --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "body"), [("GET", None), ("DELETE", None), ("PATCH", {"tags": {}})]
)
async def test_unknown_uuid_is_404(
    emulator_client: httpx.AsyncClient, method: str, body: Any
) -> None:
    response = await emulator_client.request(
        method, "/servers/2d7b4a4e-0000-4000-8000-000000000000", json=body
    )
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


async def test_delete_is_204_and_the_server_is_gone_and_logged(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    uuid = (await create(emulator_client, tags={"k8s-cluster": "a"})).json()["uuid"]
    response = await emulator_client.delete(f"/servers/{uuid}")
    assert response.status_code == 204
    assert response.content == b""
    assert (await emulator_client.get(f"/servers/{uuid}")).status_code == 404
    assert (await emulator_client.get("/servers")).json() == []
    assert (await emulator_client.delete(f"/servers/{uuid}")).status_code == 404
    [entry] = await emulator.admin.deletions()
    assert (entry["uuid"], entry["name"], entry["tags"], entry["by"]) == (
        uuid,
        "node-1",
        {"k8s-cluster": "a"},
        "api",
    )
    assert ISO_Z.match(entry["at"])


async def test_patch_replaces_the_whole_tags_object(
    emulator_client: httpx.AsyncClient,
) -> None:
    uuid = (await create(emulator_client, tags={"k8s-cluster": "a", "team": "x"})).json()["uuid"]
    response = await emulator_client.patch(f"/servers/{uuid}", json={"tags": {"role": "db"}})
    assert response.status_code == 204
    assert response.content == b""
    assert (await emulator_client.get(f"/servers/{uuid}")).json()["tags"] == {"role": "db"}
    by_old = await emulator_client.get("/servers", params={"tag:k8s-cluster": "a"})
    assert by_old.json() == []
    by_new = await emulator_client.get("/servers", params={"tag:role": "db"})
    assert [s["uuid"] for s in by_new.json()] == [uuid]


async def test_patch_renames_and_validates(emulator_client: httpx.AsyncClient) -> None:
    uuid = (await create(emulator_client)).json()["uuid"]
    assert (await emulator_client.patch(f"/servers/{uuid}", json={"name": "n2"})).status_code == 204
    assert (await emulator_client.get(f"/servers/{uuid}")).json()["name"] == "n2"
    bad = await emulator_client.patch(f"/servers/{uuid}", json={"tags": ["x"], "name": "a_b"})
    assert bad.status_code == 400
    assert set(bad.json()) == {"tags", "name"}
    not_json = await emulator_client.patch(f"/servers/{uuid}", content=b"{")
    assert not_json.status_code == 400
    assert (await emulator_client.get(f"/servers/{uuid}")).json()["name"] == "n2"


async def test_unknown_route_and_method_answer_drf_json(
    emulator_client: httpx.AsyncClient,
) -> None:
    missing = await emulator_client.get("/volumes")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not found."})
    wrong = await emulator_client.put("/servers")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": 'Method "PUT" not allowed.'})


# ---- tag filters ---------------------------------------------------------------------------


@pytest.fixture
async def mixed_fleet(emulator_admin: EmulatorAdmin) -> dict[str, list[str]]:
    """Cluster a (two groups), cluster b, a server with only a group tag, untagged ones."""
    a_workers = await emulator_admin.populate(3, {"k8s-cluster": "a", "group": "workers"})
    b = await emulator_admin.populate(2, {"k8s-cluster": "b", "group": "workers"})
    a_gpu = await emulator_admin.populate(2, {"k8s-cluster": "a", "group": "gpu"})
    loose = await emulator_admin.populate(1, {"group": "workers"})
    untagged = await emulator_admin.populate(2)
    return {"a_workers": a_workers, "b": b, "a_gpu": a_gpu, "loose": loose, "untagged": untagged}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("tag:k8s-cluster=a", ["a_workers", "a_gpu"]),
        ("tag:k8s-cluster=b", ["b"]),
        ("tag:k8s-cluster=c", []),
        ("tag:k8s-cluster=", ["a_workers", "b", "a_gpu"]),
        ("tag:k8s-cluster", ["a_workers", "b", "a_gpu"]),
        ("tag%3Ak8s-cluster=a", ["a_workers", "a_gpu"]),
        ("tag:k8s-cluster=a&tag:group=gpu", ["a_gpu"]),
        ("tag:group=workers&tag:k8s-cluster=", ["a_workers", "b"]),
        ("tag:group=", ["a_workers", "b", "a_gpu", "loose"]),
        ("tag:k8s-cluster=a&tag:k8s-cluster=b", []),
        ("", ["a_workers", "b", "a_gpu", "loose", "untagged"]),
        ("unrelated=1", ["a_workers", "b", "a_gpu", "loose", "untagged"]),
    ],
)
async def test_tag_filters_with_other_clusters_and_untagged_servers(
    emulator_client: httpx.AsyncClient,
    mixed_fleet: dict[str, list[str]],
    query: str,
    expected: list[str],
) -> None:
    response = await emulator_client.get(f"/servers?{query}")
    assert response.status_code == 200
    want = sorted(uuid for part in expected for uuid in mixed_fleet[part])
    got = [s["uuid"] for s in response.json()]
    assert sorted(got) == want


async def test_listing_is_in_creation_order_even_after_patches(
    emulator_client: httpx.AsyncClient, emulator_admin: EmulatorAdmin
) -> None:
    uuids = await emulator_admin.populate(4, {"k8s-cluster": "a"})
    await emulator_client.patch(f"/servers/{uuids[0]}", json={"tags": {"k8s-cluster": "a"}})
    listed = (await emulator_client.get("/servers", params={"tag:k8s-cluster": "a"})).json()
    assert [s["uuid"] for s in listed] == uuids


# ---- catalogue -----------------------------------------------------------------------------


REQUIRED_FLAVORS = [
    "flex-4-1",
    "flex-4-2",
    "flex-4-4",
    "flex-8-2",
    "flex-8-4",
    "flex-16-4",
    "plus-8-2",
    "plus-16-4",
    "plus-32-16",
    "plus-192-96",
    "gpu2-128-16-1-200",
]


async def test_flavor_catalogue(emulator_client: httpx.AsyncClient) -> None:
    response = await emulator_client.get("/flavors")
    assert response.status_code == 200
    flavors = {f["slug"]: f for f in response.json()}
    assert set(REQUIRED_FLAVORS) <= set(flavors)
    for slug, flavor in flavors.items():
        # vCPUs and memory are what the slug says: <family>-<mem>-<vcpu>[-...]
        memory, vcpus = (int(n) for n in slug.split("-")[1:3])
        assert (flavor["memory_gb"], flavor["vcpu_count"]) == (memory, vcpus), slug
        assert set(flavor) == {"slug", "name", "vcpu_count", "memory_gb", "gpu", "zones"}
        assert (flavor["gpu"] is not None) == slug.startswith("gpu")
    assert flavors["gpu2-128-16-1-200"]["gpu"] == {
        "count": 1,
        "name": "NVIDIA RTX PRO 6000 Max-Q",
        "vram_per_gpu_gb": 96,
        "total_vram_gb": 96,
    }
    assert flavors["flex-8-4"]["zones"] == [{"slug": "rma1"}, {"slug": "lpg1"}]
    single_zone = [slug for slug, f in flavors.items() if len(f["zones"]) == 1]
    assert "gpu2-128-16-1-200" in single_zone


async def test_images_regions_and_server_groups(emulator_client: httpx.AsyncClient) -> None:
    images = {i["slug"]: i for i in (await emulator_client.get("/images")).json()}
    assert {"debian-12", "debian-13", "ubuntu-24.04"} <= set(images)
    assert images["debian-12"] == {
        "slug": "debian-12",
        "name": "Debian 12",
        "operating_system": "Debian",
        "default_username": "debian",
        "zones": [{"slug": "rma1"}, {"slug": "lpg1"}],
    }
    regions = (await emulator_client.get("/regions")).json()
    assert regions == [
        {"slug": "rma", "zones": [{"slug": "rma1"}]},
        {"slug": "lpg", "zones": [{"slug": "lpg1"}]},
    ]
    groups = (await emulator_client.get("/server-groups")).json()
    assert len(groups) >= 2
    assert {g["type"] for g in groups} == {"anti-affinity"}
    assert {g["zone"]["slug"] for g in groups} == {"rma1", "lpg1"}
    assert all(g["servers"] == [] for g in groups)


def test_catalogue_numbers_come_from_the_slugs() -> None:
    gpu = FLAVORS["gpu2-256-32-2-400"]
    assert (gpu.memory_gb, gpu.vcpu_count) == (256, 32)
    assert gpu.gpu is not None and gpu.gpu.to_json()["total_vram_gb"] == 192


# ---- admin API -----------------------------------------------------------------------------


async def test_admin_servers_create_and_delete(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    admin = emulator.admin
    stopped = await admin.create_server("legacy", status="stopped")
    tagged = await admin.create_server("w1", tags={"k8s-cluster": "a"}, zone="lpg1")
    assert stopped["status"] == "stopped"
    assert [s["name"] for s in await admin.servers()] == ["legacy", "w1"]
    api_view = (await emulator_client.get(f"/servers/{stopped['uuid']}")).json()
    assert api_view["status"] == "stopped"
    await admin.delete_server(tagged["uuid"])
    assert [s["name"] for s in await admin.servers()] == ["legacy"]
    [entry] = await admin.deletions()
    assert (entry["uuid"], entry["by"], entry["tags"]) == (
        tagged["uuid"],
        "admin",
        {"k8s-cluster": "a"},
    )
    with pytest.raises(httpx.HTTPStatusError) as missing:
        await admin.delete_server(tagged["uuid"])
    assert missing.value.response.status_code == 404


async def test_admin_shows_the_user_data_each_create_request_gave(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    """The API never returns user_data; the admin API does, for tests that play the kubelet."""
    booted = (await create(emulator_client, name="n1", user_data="#cloud-config\n")).json()
    bare = (await create(emulator_client, name="n2")).json()
    assert "user_data" not in booted
    assert await emulator.admin.user_data() == {
        booted["uuid"]: "#cloud-config\n",
        bare["uuid"]: None,
    }


async def test_populate_creates_running_servers_with_tags(
    emulator_client: httpx.AsyncClient, emulator_admin: EmulatorAdmin
) -> None:
    uuids = await emulator_admin.populate(
        3, {"k8s-cluster": "a"}, flavor="plus-8-2", zone="lpg1", name_prefix="bench"
    )
    listed = (await emulator_client.get("/servers")).json()
    assert [s["uuid"] for s in listed] == uuids
    assert {(s["status"], s["flavor"]["slug"], s["zone"]["slug"]) for s in listed} == {
        ("running", "plus-8-2", "lpg1")
    }
    assert all(s["name"].startswith("bench-") for s in listed)
    assert len({s["name"] for s in listed}) == 3


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("servers", {**CREATE, "status": "sleeping"}, "status"),
        ("servers", {**CREATE, "flavor": "nope"}, "flavor"),
        ("servers", {"flavor": "flex-4-2", "image": "debian-12"}, "name"),
        ("populate", {}, "count"),
        ("populate", {"count": 0}, "count"),
        ("populate", {"count": 100_001}, "count"),
        ("populate", {"count": 1, "flavor": "nope"}, "flavor"),
        ("populate", {"count": 1, "name_prefix": "bad_prefix"}, "name_prefix"),
        ("populate", {"count": 1, "status": "sleeping"}, "status"),
        ("populate", {"count": 1, "server_groups": [RMA1_GROUP]}, "server_groups"),
    ],
)
async def test_admin_create_and_populate_validate(
    emulator: RunningEmulator, path: str, body: dict[str, Any], field: str
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{emulator.admin_url}/{path}", json=body)
    assert response.status_code == 400
    assert field in response.json()
    assert await emulator.admin.servers() == []


async def test_stats_count_requests_per_endpoint_and_status(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator_client.get("/servers")
    await emulator_client.get("/servers")
    await emulator_client.get("/flavors")
    await emulator_client.post("/servers", json={})
    await emulator_client.get("/servers/2d7b4a4e-0000-4000-8000-000000000000")
    assert await emulator.admin.stats() == {
        "list_servers": {"200": 2},
        "list_flavors": {"200": 1},
        "create_server": {"400": 1},
        "get_server": {"404": 1},
    }


async def test_reset_clears_servers_faults_logs_and_stats(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    admin = emulator.admin
    uuid = (await create(emulator_client)).json()["uuid"]
    await create(emulator_client, name="node-2")
    await emulator_client.delete(f"/servers/{uuid}")
    await admin.set_faults({"down": True})
    await admin.reset()
    assert await admin.servers() == []
    assert await admin.deletions() == []
    assert await admin.stats() == {}
    assert await admin.faults() == {}
    assert (await emulator_client.get("/servers")).status_code == 200


# ---- scale ---------------------------------------------------------------------------------


async def test_holds_and_lists_5000_cluster_servers_among_others(
    emulator_client: httpx.AsyncClient, emulator_admin: EmulatorAdmin
) -> None:
    await emulator_admin.populate(300, {"k8s-cluster": "other"})
    ours = await emulator_admin.populate(5000, {"k8s-cluster": "big", "group": "workers"})
    await emulator_admin.populate(200)
    listed = (await emulator_client.get("/servers", params={"tag:k8s-cluster": "big"})).json()
    assert [s["uuid"] for s in listed] == ours
    assert all(s["tags"]["k8s-cluster"] == "big" for s in listed)
    everything = (await emulator_client.get("/servers")).json()
    assert len(everything) == 5500


async def test_concurrent_clients(
    emulator_client: httpx.AsyncClient, emulator_admin: EmulatorAdmin
) -> None:
    await emulator_admin.populate(50, {"k8s-cluster": "a"})

    async def create_and_list(i: int) -> int:
        await create(emulator_client, name=f"c{i}", tags={"k8s-cluster": "a"})
        listed = await emulator_client.get("/servers", params={"tag:k8s-cluster": "a"})
        return len(listed.json())

    counts = await asyncio.gather(*(create_and_list(i) for i in range(30)))
    assert min(counts) >= 51
    assert len(await emulator_admin.servers()) == 80


# ---- command line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:8087", ("127.0.0.1", 8087)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9000", ("::1", 9000)),
        (":8087", ("127.0.0.1", 8087)),
    ],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["8087", "host:", "host:http", "host:70000"])
def test_parse_listen_rejects(listen: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(listen)


async def test_emulator_command_serves_until_sigterm() -> None:
    code = (
        "import logging, sys;"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr);"
        "from cloudscale_autoscaler.commands.emulator import emulator_command;"
        "sys.exit(emulator_command('127.0.0.1:0', 'cli-token', 3, 0.0))"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    try:
        line = b""
        while b"listening on" not in line:
            line = await asyncio.wait_for(process.stderr.readline(), 30)
            assert line, "emulator exited before listening"
        match = re.search(rb"(http://127\.0\.0\.1:\d+/v1)", line)
        assert match is not None
        url = match.group(1).decode()
        async with httpx.AsyncClient(base_url=url) as client:
            denied = await client.get("/servers")
            allowed = await client.get("/servers", headers={"Authorization": "Bearer cli-token"})
        assert (denied.status_code, allowed.status_code) == (401, 200)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0


def test_emulator_command_rejects_a_bad_listen_address() -> None:
    from cloudscale_autoscaler.commands.emulator import emulator_command

    assert emulator_command("nonsense", None, 0, 0.0) == 2


async def test_a_flavor_changed_by_the_admin_api_is_what_the_api_lists(
    emulator: RunningEmulator, emulator_client: httpx.AsyncClient
) -> None:
    await emulator.admin.change_flavor("flex-4-2", memory_gb=6)
    await emulator.admin.change_flavor("flex-4-2", vcpu_count=float("inf"))
    listed = {f["slug"]: f for f in (await emulator_client.get("/flavors")).json()}
    assert (listed["flex-4-2"]["memory_gb"], listed["flex-4-2"]["vcpu_count"]) == (6, float("inf"))
    assert listed["flex-8-4"]["memory_gb"] == 8
    with pytest.raises(httpx.HTTPStatusError) as unknown:
        await emulator.admin.change_flavor("flex-99-99", memory_gb=1)
    assert unknown.value.response.status_code == 404
    await emulator.admin.reset()
    listed = {f["slug"]: f for f in (await emulator_client.get("/flavors")).json()}
    assert listed["flex-4-2"]["memory_gb"] == 4
