"""`cloudscale-autoscaler rpc`: each of the 15 RPCs called by hand as real processes, against
the real `demo` process (provider and emulator) with CA's cloud-config and client certificate
that the demo writes; the node shapes of NodeGroupForNode and DeleteNodes filled from a server
UUID or a server name; errors said in one line."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.tools import cli, run_cli

from cloudscale_autoscaler.cloud.client import CloudscaleClient
from cloudscale_autoscaler.commands.rpc import METHODS
from cloudscale_autoscaler.config.loader import load_config


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo, serving after its timeline; its workspace (config.yaml, cloud-config.yaml)."""
    workspace = tmp_path_factory.mktemp("demo")
    process = subprocess.Popen(
        cli("demo", "--certs-dir", str(workspace)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if "Serving until Ctrl-C" in line:
            break
    else:
        pytest.fail("the demo ended before serving")
    try:
        yield workspace
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def rpc(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("rpc", "--cloud-config", str(workspace / "cloud-config.yaml"), *args)


def answer(workspace: Path, *args: str) -> Any:
    done = rpc(workspace, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_there_are_15_methods_and_each_is_answered(demo: Path) -> None:
    assert len(METHODS) == 15
    for method in METHODS:
        done = (
            rpc(demo, method, "--group", "workers")
            if "id" in METHODS[method].input_type.fields_by_name
            else rpc(demo, method)
        )
        # An answer (JSON) or the provider's status, never a crash or a usage error.
        assert done.returncode in (0, 1), (method, done.stderr)
        if done.returncode == 0:
            json.loads(done.stdout)
        else:
            assert done.stderr.startswith(f"rpc {method}: "), done.stderr


def test_node_groups_and_a_scale_up_by_hand(demo: Path) -> None:
    groups = answer(demo, "NodeGroups")["nodeGroups"]
    assert {g["id"] for g in groups} == {"workers", "gpu"}
    before = answer(demo, "NodeGroupTargetSize", "--group", "workers").get("targetSize", 0)
    assert answer(demo, "NodeGroupIncreaseSize", '{"id": "workers", "delta": 1}') == {}
    assert answer(demo, "NodeGroupTargetSize", "--group", "workers")["targetSize"] == before + 1


def test_for_node_and_delete_nodes_take_a_uuid_or_a_server_name(demo: Path) -> None:
    answer(demo, "Refresh")
    instances = answer(demo, "NodeGroupNodes", "--group", "workers").get("instances", [])
    if not instances:
        answer(demo, "NodeGroupIncreaseSize", '{"id": "workers", "delta": 1}')
        answer(demo, "Refresh")
        instances = answer(demo, "NodeGroupNodes", "--group", "workers")["instances"]
    provider_id = instances[0]["id"]
    uuid = provider_id.removeprefix("cloudscale://")
    found = answer(demo, "NodeGroupForNode", "--node", uuid)
    assert found["nodeGroup"]["id"] == "workers"
    # By name: looked up in the (emulated) API with the provider's config.
    name = asyncio.run(_server_name(demo, uuid))
    config = str(demo / "config.yaml")
    by_name = answer(demo, "NodeGroupForNode", "--node", name, "--config", config)
    assert by_name["nodeGroup"]["id"] == "workers"
    assert (
        answer(
            demo, "NodeGroupDeleteNodes", "--group", "workers", "--node", name, "--config", config
        )
        == {}
    )
    answer(demo, "Refresh")
    left = answer(demo, "NodeGroupNodes", "--group", "workers").get("instances", [])
    assert provider_id not in {i["id"] for i in left}


async def _server_name(workspace: Path, uuid: str) -> str:
    """The server's name, from the API the demo's config points at."""
    config = load_config(workspace / "config.yaml")
    async with CloudscaleClient.from_config(config.cloudscale) as client:
        servers = await client.list_servers(config.cluster)
    return next(server.name for server in servers if server.uuid == uuid)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["NodeGroupz"], "unknown method 'NodeGroupz'; expected one of NodeGroups"),
        (["NodeGroups", "--group", "w"], "--group: NodeGroups takes no node group id"),
        (["NodeGroupTargetSize", '{"idd": 1}'], "NodeGroupTargetSize request: Message type"),
        (["NodeGroupForNode", "--node", "some-name"], "a server name needs --config"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(demo: Path, args: list[str], says: str) -> None:
    done = rpc(demo, *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_error_answer_names_its_code_and_exits_1(demo: Path) -> None:
    done = rpc(demo, "NodeGroupIncreaseSize", '{"id": "workers", "delta": 99}')
    assert done.returncode == 1
    assert done.stderr.startswith("rpc NodeGroupIncreaseSize: FAILED_PRECONDITION: "), done.stderr
    assert "would exceed its maxSize" in done.stderr


def test_a_missing_cloud_config_file_is_named(tmp_path: Path) -> None:
    cloud_config = tmp_path / "cloud-config.yaml"
    cloud_config.write_text("address: 127.0.0.1:1\ncert: c.crt\nkey: c.key\ncacert: ca.crt\n")
    done = run_cli("rpc", "--cloud-config", str(cloud_config), "NodeGroups")
    assert done.returncode == 2
    assert f"cert: cannot read {tmp_path}/c.crt" in done.stderr
