"""Node groups on private networks: the `interfaces` config, the emulator's networks, subnets
and interface validation, the create path over mTLS, and `check-config --online`."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.stack import StackFactory, group, wait_until
from test_check_config import check_online, failure_lines, write_config

from cloudscale_autoscaler.cloud.client import CloudscaleClient
from cloudscale_autoscaler.cloud.emulator.catalogue import PRIVATE
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.settings.types import ConfigError, NetworkInterface

# The emulator's networks (docs/emulator.md).
NODES_LPG = "7a1c0000-0000-4000-8000-000000000001"
NODES_LPG_A = "7a1c0000-0000-4000-8000-000000000101"  # 10.20.0.0/24
NODES_LPG_B = "7a1c0000-0000-4000-8000-000000000102"  # 10.20.1.0/24
NODES_RMA = "7a1c0000-0000-4000-8000-000000000002"
NODES_RMA_SUBNET = "7a1c0000-0000-4000-8000-000000000201"  # 10.30.0.0/24


# --- config ---------------------------------------------------------------------------------


def load_group(tmp_path: Path, **fields: Any) -> Any:
    doc = {
        "cluster": "prod",
        "tls": {"insecure": True},
        "cloudscale": {"url": "http://127.0.0.1:1/v1", "tokenFile": "token"},
        "nodeGroups": [
            {"name": "w", "minSize": 0, "maxSize": 3, "flavor": "flex-4-2", "image": "d", **fields}
        ],
    }
    (tmp_path / "token").write_text("t0123456789\n")
    (tmp_path / "token").chmod(0o600)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_config(path)


@pytest.mark.parametrize(
    ("interfaces", "expected"),
    [
        (["public"], (NetworkInterface("public"),)),
        ([{"network": "public"}], (NetworkInterface("public"),)),
        (
            ["public", {"network": "k8s-nodes", "subnet": NODES_LPG_B}],
            (NetworkInterface("public"), NetworkInterface("k8s-nodes", NODES_LPG_B)),
        ),
        ([{"network": NODES_LPG}], (NetworkInterface(NODES_LPG),)),
        # UUIDs are kept in their canonical lowercase form: the API's lookups may be exact.
        (
            [{"network": NODES_LPG.upper(), "subnet": NODES_LPG_B.upper()}],
            (NetworkInterface(NODES_LPG, NODES_LPG_B),),
        ),
    ],
)
def test_interfaces_parse(tmp_path: Path, interfaces: list[Any], expected: Any) -> None:
    config = load_group(tmp_path, zone="lpg1", interfaces=interfaces)
    assert config.node_groups[0].interfaces == expected


def test_no_interfaces_means_the_use_flags(tmp_path: Path) -> None:
    assert load_group(tmp_path).node_groups[0].interfaces is None


@pytest.mark.parametrize(
    ("fields", "errors"),
    [
        (
            {"interfaces": ["public"], "usePublicNetwork": False},
            [
                "nodeGroups[0].interfaces: cannot be combined with usePublicNetwork (the API "
                "refuses both in one request): describe the public network as an entry "
                "`public` instead"
            ],
        ),
        (
            {"interfaces": []},
            [
                "nodeGroups[0].interfaces: must contain at least one interface (or leave "
                "interfaces out)"
            ],
        ),
        (
            {"interfaces": "public"},
            ['nodeGroups[0].interfaces: expected a list, got string "public"'],
        ),
        (
            {"interfaces": ["private"]},
            [
                'nodeGroups[0].interfaces[0]: expected "public" or a mapping {network: UUID '
                'or name, subnet: UUID}, got string "private"'
            ],
        ),
        (
            {"interfaces": [{"subnet": NODES_LPG_A}]},
            ["nodeGroups[0].interfaces[0].network: required"],
        ),
        (
            {"interfaces": [{"network": "public", "subnet": NODES_LPG_A}]},
            ["nodeGroups[0].interfaces[0].subnet: the public network has no subnet to choose"],
        ),
        (
            {"interfaces": [{"network": "k8s-nodes", "subnet": "10.20.0.0/24"}]},
            [
                'nodeGroups[0].interfaces[0].subnet: invalid UUID "10.20.0.0/24": expected '
                "the form 01234567-89ab-cdef-0123-456789abcdef"
            ],
        ),
        (
            {"interfaces": [{"network": "k8s-nodes", "addresses": [{"address": "10.0.0.5"}]}]},
            [
                "nodeGroups[0].interfaces[0].addresses: fixed addresses are not supported: "
                "every server of the group would get the same address; the API assigns one "
                "from the subnet"
            ],
        ),
        (
            {"interfaces": [{"network": "k8s-nodes", "mtu": 1500}]},
            ["nodeGroups[0].interfaces[0].mtu: unknown key; expected one of: network, subnet"],
        ),
        (
            {"interfaces": ["public", {"network": "k8s-nodes"}, {"network": "k8s-nodes"}]},
            [
                'nodeGroups[0].interfaces[2]: network "k8s-nodes" is already attached by '
                "nodeGroups[0].interfaces[1]"
            ],
        ),
        (
            {"interfaces": [{"network": NODES_LPG}, {"network": NODES_LPG.upper()}]},
            [
                f'nodeGroups[0].interfaces[1]: network "{NODES_LPG}" is already attached by '
                "nodeGroups[0].interfaces[0]"
            ],
        ),
    ],
)
def test_interfaces_errors(tmp_path: Path, fields: dict[str, Any], errors: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_group(tmp_path, **{"zone": "lpg1", **fields})
    assert caught.value.errors == errors


@pytest.mark.parametrize(
    "interfaces",
    [
        [{"network": "k8s-nodes"}],
        ["public", {"network": NODES_LPG, "subnet": NODES_LPG_A}],
    ],
)
def test_private_networks_need_the_groups_zone(tmp_path: Path, interfaces: list[Any]) -> None:
    # Networks are zonal: without a zone the API picks the project's default zone, and every
    # create would be refused although check-config --online had nothing to compare.
    with pytest.raises(ConfigError) as caught:
        load_group(tmp_path, interfaces=interfaces)
    assert caught.value.errors == [
        "nodeGroups[0].zone: required when interfaces name a private network (or give "
        "`zones`): networks are zonal, and without a zone the API creates servers in the "
        "project's default zone"
    ]
    assert load_group(tmp_path, interfaces=["public"]).node_groups[0].zone is None


# --- emulator -------------------------------------------------------------------------------


async def test_emulator_lists_networks_and_subnets(emulator: RunningEmulator) -> None:
    async with CloudscaleClient(emulator.url, TOKEN) as client:
        networks = {n.uuid: n for n in await client.list_networks()}
        subnets = {s.uuid: s for s in await client.list_subnets()}
    assert networks[NODES_LPG].name == "k8s-nodes"
    assert networks[NODES_LPG].zone == "lpg1"
    assert networks[NODES_LPG].subnets == (NODES_LPG_A, NODES_LPG_B)
    assert networks[NODES_RMA].zone == "rma1"
    assert networks[PRIVATE["lpg1"].uuid].subnets == (PRIVATE["lpg1"].subnet_uuid,)
    assert subnets[NODES_LPG_B].cidr == "10.20.1.0/24"
    assert subnets[NODES_LPG_B].network_uuid == NODES_LPG
    # Every subnet is listed under its network and the other way round.
    assert {(s.uuid, s.network_uuid) for s in subnets.values()} == {
        (subnet, n.uuid) for n in networks.values() for subnet in n.subnets
    }


def create_body(**fields: Any) -> dict[str, Any]:
    return {"name": "n1", "flavor": "flex-4-2", "image": "debian-12", "zone": "lpg1", **fields}


@pytest.mark.parametrize(
    ("interfaces", "expected"),
    [
        # (type, network uuid, subnet uuid or None) per interface
        ([{"network": "public"}], [("public", None, None)]),
        (
            [{"network": NODES_LPG, "addresses": [{"subnet": NODES_LPG_B}]}],
            [("private", NODES_LPG, NODES_LPG_B)],
        ),
        ([{"addresses": [{"subnet": NODES_LPG_B}]}], [("private", NODES_LPG, NODES_LPG_B)]),
        ([{"network": NODES_LPG}], [("private", NODES_LPG, NODES_LPG_A)]),
        (
            [{"network": "public"}, {"network": NODES_LPG, "addresses": []}],
            [("public", None, None), ("private", NODES_LPG, None)],
        ),
        # The SDKs' subnet is optional: a fixed address picks the network's subnet holding it,
        # an empty entry the network's first subnet.
        (
            [{"network": NODES_LPG, "addresses": [{"address": "10.20.1.50"}]}],
            [("private", NODES_LPG, NODES_LPG_B)],
        ),
        ([{"network": NODES_LPG, "addresses": [{}]}], [("private", NODES_LPG, NODES_LPG_A)]),
    ],
)
async def test_emulator_creates_the_requested_interfaces(
    emulator: RunningEmulator,
    emulator_client: httpx.AsyncClient,
    interfaces: list[dict[str, Any]],
    expected: list[tuple[str, str | None, str | None]],
) -> None:
    response = await emulator_client.post("/servers", json=create_body(interfaces=interfaces))
    assert response.status_code == 201, response.text
    listed = response.json()["interfaces"]
    seen = []
    for interface in listed:
        if interface["type"] == "public":
            seen.append(("public", None, None))
            continue
        subnets = [a["subnet"]["uuid"] for a in interface["addresses"]]
        seen.append(("private", interface["network"]["uuid"], subnets[0] if subnets else None))
    assert seen == expected
    fixed = {a.get("address") for i in interfaces for a in i.get("addresses", [])}
    for interface in listed:
        if interface["type"] == "public":
            continue
        for address in interface["addresses"]:
            assert address["gateway"] is None  # the emulator's subnets set no gateway_address
            ip = ipaddress.ip_address(address["address"])
            assert ip in ipaddress.ip_network(address["subnet"]["cidr"])
            # Assigned addresses come from the DHCP range .101-.254.
            assert address["address"] in fixed or 101 <= int(ip) % 256 <= 254


@pytest.mark.parametrize(
    ("fields", "errors"),
    [
        (
            {"interfaces": [{"network": "public"}], "use_public_network": True},
            {"interfaces": ["Cannot be combined with use_public_network."]},
        ),
        (
            {"interfaces": [{"network": NODES_LPG, "addresses": [{"subnet": NODES_RMA_SUBNET}]}]},
            {
                "interfaces": [
                    {
                        "addresses": [
                            {
                                "subnet": [
                                    f"Subnet {NODES_RMA_SUBNET} does not belong to network "
                                    f"{NODES_LPG}."
                                ]
                            }
                        ]
                    }
                ]
            },
        ),
        (
            {"interfaces": [{"network": NODES_RMA}]},
            {
                "interfaces": [
                    {"network": [f"Network {NODES_RMA} is in zone rma1, not in zone lpg1."]}
                ]
            },
        ),
        (
            {"interfaces": [{"addresses": [{"subnet": NODES_RMA_SUBNET}]}]},
            {
                "interfaces": [
                    {
                        "addresses": [
                            {
                                "subnet": [
                                    f"Subnet {NODES_RMA_SUBNET} is in zone rma1, not in zone lpg1."
                                ]
                            }
                        ]
                    }
                ]
            },
        ),
        (
            {"interfaces": [{"network": "public"}, {"network": "nope"}]},
            {"interfaces": [{}, {"network": ["Object with uuid=nope does not exist."]}]},
        ),
        (
            {"interfaces": [{"network": NODES_LPG, "addresses": [{"address": "10.30.0.50"}]}]},
            {
                "interfaces": [
                    {
                        "addresses": [
                            {
                                "address": [
                                    f"Address 10.30.0.50 is not in any subnet of network "
                                    f"{NODES_LPG}."
                                ]
                            }
                        ]
                    }
                ]
            },
        ),
        (
            {"interfaces": [{"addresses": [{"address": "10.20.0.50"}]}]},
            {
                "interfaces": [
                    {
                        "addresses": [
                            {
                                "subnet": [
                                    "This field is required when the interface has no network."
                                ]
                            }
                        ]
                    }
                ]
            },
        ),
        ({"interfaces": []}, {"interfaces": ["This list may not be empty."]}),
        (
            {"interfaces": ["public"]},
            {
                "interfaces": [
                    {"non_field_errors": ["Invalid data. Expected a dictionary, but got str."]}
                ]
            },
        ),
    ],
)
async def test_emulator_refuses_bad_interfaces(
    emulator_client: httpx.AsyncClient, fields: dict[str, Any], errors: dict[str, Any]
) -> None:
    response = await emulator_client.post("/servers", json=create_body(**fields))
    assert response.status_code == 400
    assert response.json() == errors


# --- the create path over mTLS ----------------------------------------------------------------


async def test_private_only_group_creates_servers_with_exactly_that_interface(
    stack: StackFactory,
) -> None:
    workers = group("workers", 0, 5, interfaces=(NetworkInterface("k8s-nodes", NODES_LPG_B),))
    s = await stack(groups=[workers])
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    await s.settle("workers")
    servers = await s.cloud_servers("workers")
    assert len(servers) == 2
    for server in servers:
        [interface] = server["interfaces"]
        assert interface["type"] == "private"
        assert interface["network"]["uuid"] == NODES_LPG
        [address] = interface["addresses"]
        assert address["subnet"]["uuid"] == NODES_LPG_B
        assert ipaddress.ip_address(address["address"]) in ipaddress.ip_network("10.20.1.0/24")


async def test_uuids_written_in_uppercase_create_servers(
    stack: StackFactory, tmp_path: Path
) -> None:
    # The loader's interfaces feed the create path: the API need not match UUIDs ignoring case.
    loaded = load_group(
        tmp_path,
        zone="lpg1",
        interfaces=[{"network": NODES_LPG.upper(), "subnet": NODES_LPG_B.upper()}],
    )
    workers = group("workers", 0, 5, interfaces=loaded.node_groups[0].interfaces)
    s = await stack(groups=[workers])
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1))
    await s.settle("workers")
    [server] = await s.cloud_servers("workers")
    [interface] = server["interfaces"]
    assert interface["network"]["uuid"] == NODES_LPG
    assert interface["addresses"][0]["subnet"]["uuid"] == NODES_LPG_B


@pytest.mark.parametrize(
    ("interface", "api_text"),
    [
        (
            NetworkInterface(NODES_LPG, NODES_RMA_SUBNET),
            f"interfaces.0.addresses.0.subnet: Subnet {NODES_RMA_SUBNET} does not belong to "
            f"network {NODES_LPG}.",
        ),
        (
            NetworkInterface(NODES_RMA),
            f"interfaces.0.network: Network {NODES_RMA} is in zone rma1, not in zone lpg1.",
        ),
    ],
)
async def test_create_path_refuses_wrong_subnet_or_zone_with_the_api_text(
    stack: StackFactory, interface: NetworkInterface, api_text: str
) -> None:
    s = await stack(
        groups=[group("workers", 0, 5, interfaces=(interface,))], increase_size_wait_seconds=5.0
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1))
    # A refusal no retry can fix: FAILED_PRECONDITION with the API's text, not UNAVAILABLE.
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert api_text in (caught.value.details() or "")
    assert await s.target("workers") == 0
    assert await s.cloud_servers("workers") == []


@pytest.mark.parametrize(
    ("network", "reason"),
    [
        ("nowhere", 'interfaces[0].network: no network named "nowhere" in zone lpg1'),
        (
            "shared",
            'interfaces[0].network: 2 networks are named "shared" in zone lpg1 '
            "(7a1c0000-0000-4000-8000-000000000003, 7a1c0000-0000-4000-8000-000000000004): "
            "give the UUID instead",
        ),
    ],
)
async def test_network_names_must_match_exactly_one_network(
    stack: StackFactory, network: str, reason: str
) -> None:
    s = await stack(groups=[group("workers", 0, 5, interfaces=(NetworkInterface(network),))])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == f"node group workers: {reason}"
    assert await s.target("workers") == 0


async def test_network_names_are_resolved_once(stack: StackFactory) -> None:
    s = await stack(groups=[group("workers", 0, 5, interfaces=(NetworkInterface("k8s-nodes"),))])

    async def checked_at_start() -> bool:  # the start-up check lists networks, then subnets
        return (await s.admin.stats()).get("list_subnets") == {"200": 1}

    await wait_until(checked_at_start, 30, "the start-up check listed no subnets")
    for _ in range(2):
        await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1))
    await s.settle("workers")
    stats = await s.admin.stats()
    assert stats["list_networks"] == {"200": 2}  # the start-up check's, and one resolution
    servers = await s.cloud_servers("workers")
    assert [srv["interfaces"][0]["network"]["uuid"] for srv in servers] == [NODES_LPG] * 2


async def test_rejected_token_while_listing_networks_is_permission_denied(
    stack: StackFactory,
) -> None:
    s = await stack(groups=[group("workers", 0, 5, interfaces=(NetworkInterface("k8s-nodes"),))])
    await s.admin.set_faults({"error_rate": {"list_networks": {"rate": 1.0, "status": 401}}})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1))
    # No retry fixes a rejected token: CA must see it as such, not as an outage.
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value.details()
    details = caught.value.details() or ""
    assert details.startswith("node group workers: listing networks to resolve network names")
    assert "HTTP 401" in details
    assert await s.target("workers") == 0


# --- check-config --online ------------------------------------------------------------------


def network_group(name: str, zone: str, interfaces: list[Any]) -> dict[str, Any]:
    return {
        "name": name,
        "minSize": 0,
        "maxSize": 1,
        "flavor": "flex-4-2",
        "image": "debian-12",
        "zone": zone,
        "interfaces": interfaces,
    }


async def test_online_accepts_networks_and_subnets_of_the_zone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], emulator: RunningEmulator
) -> None:
    groups = [
        network_group("a", "lpg1", ["public", {"network": "k8s-nodes", "subnet": NODES_LPG_B}]),
        network_group("b", "rma1", [{"network": NODES_RMA, "subnet": NODES_RMA_SUBNET}]),
    ]
    path = write_config(tmp_path, groups, url=emulator.url, token=TOKEN)
    assert await check_online(path) == 0, capsys.readouterr().err


async def test_online_refuses_wrong_subnet_and_network_in_another_zone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], emulator: RunningEmulator
) -> None:
    groups = [
        network_group("a", "lpg1", [{"network": "k8s-nodes", "subnet": NODES_RMA_SUBNET}]),
        network_group("b", "lpg1", [{"network": NODES_RMA}]),
        network_group("c", "lpg1", [{"network": "shared"}, {"network": "gone"}]),
        network_group("d", "lpg1", [{"network": NODES_LPG, "subnet": NODES_RMA_SUBNET[:-1] + "9"}]),
    ]
    path = write_config(tmp_path, groups, url=emulator.url, token=TOKEN)
    assert await check_online(path) == 2
    err = failure_lines(capsys.readouterr().err, emulator.url)
    assert err == [
        f"online check against {emulator.url} (5 errors):",
        f"  nodeGroups[0].interfaces[0].subnet: subnet {NODES_RMA_SUBNET} (10.30.0.0/24) "
        f'belongs to network "k8s-nodes" ({NODES_RMA}, zone rma1), not to "k8s-nodes" '
        f"({NODES_LPG}, zone lpg1)",
        f'  nodeGroups[1].interfaces[0].network: network "k8s-nodes" ({NODES_RMA}, zone rma1) '
        "is not in the group's zone lpg1",
        '  nodeGroups[2].interfaces[0].network: 2 networks are named "shared" in zone lpg1 '
        "(7a1c0000-0000-4000-8000-000000000003, 7a1c0000-0000-4000-8000-000000000004): "
        "give the UUID instead",
        '  nodeGroups[2].interfaces[1].network: no network named "gone" in zone lpg1',
        f"  nodeGroups[3].interfaces[0].subnet: no subnet with UUID {NODES_RMA_SUBNET[:-1] + '9'}",
    ]
