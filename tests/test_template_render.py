"""`template` command and the Node -> Kubernetes JSON object conversion.

The command tests run the real command against the emulator over HTTP on 127.0.0.1; the
command owns its event loop (asyncio.run), so it runs in a worker thread while the emulator
serves on the test's loop.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.emulator import TOKEN, RunningEmulator

from cloudscale_autoscaler.cli import main
from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.commands.template import render, template_command
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.settings.types import KubeletConfig, NodeGroupConfig, Taint
from cloudscale_autoscaler.template.node import build_template_node
from cloudscale_autoscaler.template.render import node_to_dict

FLEX = Flavor(slug="flex-16-8", name="Flex-16-8", vcpu_count=8, memory_gb=16)
WORKERS = NodeGroupConfig(
    name="workers",
    min_size=0,
    max_size=10,
    flavor="flex-16-8",
    image="debian-12",
    zone="lpg1",
    volume_size_gb=100,
    labels=(("role", "worker"),),
    taints=(Taint(key="dedicated", value="batch", effect="NoSchedule"),),
    kubelet=KubeletConfig(
        system_reserved=(("cpu", "50m"), ("memory", "384Mi"), ("ephemeral-storage", "256Mi")),
        eviction_hard=(("memory.available", "100Mi"), ("nodefs.available", "10%")),
    ),
)

EXPECTED_WORKERS: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "template-workers",
        "labels": {
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": "template-workers",
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "flex-16-8",
            "role": "worker",
            "topology.kubernetes.io/region": "lpg",
            "topology.kubernetes.io/zone": "lpg1",
        },
        "annotations": {
            "autoscaler.cloudscale.ch/cluster": "prod",
            "autoscaler.cloudscale.ch/node-group": "workers",
        },
    },
    "spec": {"taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]},
    "status": {
        "capacity": {"cpu": "8", "ephemeral-storage": "100Gi", "memory": "16Gi", "pods": "110"},
        "allocatable": {
            "cpu": "7950m",
            "ephemeral-storage": "91904Mi",
            "memory": "15900Mi",
            "pods": "110",
        },
        "phase": "Running",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
            },
            {
                "type": "MemoryPressure",
                "status": "False",
                "reason": "KubeletHasSufficientMemory",
                "message": "kubelet has sufficient memory",
            },
            {
                "type": "DiskPressure",
                "status": "False",
                "reason": "KubeletHasNoDiskPressure",
                "message": "kubelet has no disk pressure",
            },
            {
                "type": "PIDPressure",
                "status": "False",
                "reason": "KubeletHasSufficientPID",
                "message": "kubelet has sufficient PID available",
            },
        ],
        "nodeInfo": {"operatingSystem": "linux", "architecture": "amd64"},
    },
}


def test_node_to_dict() -> None:
    document = node_to_dict(build_template_node("prod", WORKERS, FLEX, "cloudscale.ch/gpu"))
    assert document == EXPECTED_WORKERS
    # Maps come out sorted, so YAML/JSON output is stable and diffable.
    assert list(document["metadata"]["labels"]) == sorted(document["metadata"]["labels"])
    assert list(document) == ["apiVersion", "kind", "metadata", "spec", "status"]


def test_node_to_dict_without_taints_keeps_an_empty_spec() -> None:
    node = build_template_node("prod", replace(WORKERS, taints=()), FLEX, "cloudscale.ch/gpu")
    assert node_to_dict(node)["spec"] == {}


def test_node_to_dict_formats_times() -> None:
    node = core_v1_pb2.Node()
    node.spec.taints.add(key="k", effect="NoExecute").timeAdded.seconds = 1_700_000_000
    assert node_to_dict(node)["spec"]["taints"] == [
        {"key": "k", "effect": "NoExecute", "timeAdded": "2023-11-14T22:13:20Z"}
    ]


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_render_parses_back(output: str) -> None:
    text = render(EXPECTED_WORKERS, output)
    loaded = json.loads(text) if output == "json" else yaml.safe_load(text)
    assert loaded == EXPECTED_WORKERS
    assert text.endswith("\n")


# --- the command, against the emulator --------------------------------------------------------


def write_config(tmp_path: Path, url: str, flavor: str = "flex-16-8", token: str = TOKEN) -> Path:
    (tmp_path / "token").write_text(token + "\n", encoding="utf-8")
    (tmp_path / "token").chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
cluster: prod
tls: {{insecure: true}}
cloudscale: {{url: "{url}", tokenFile: token}}
nodeGroups:
  - name: workers
    minSize: 0
    maxSize: 10
    flavor: {flavor}
    image: debian-12
    zone: lpg1
    volumeSizeGB: 100
    labels: {{role: worker}}
    taints: [{{key: dedicated, value: batch, effect: NoSchedule}}]
    kubelet:
      systemReserved: {{cpu: 50m, memory: 384Mi, ephemeral-storage: 256Mi}}
      evictionHard: {{memory.available: 100Mi, nodefs.available: "10%"}}
  - name: gpu
    minSize: 0
    maxSize: 2
    flavor: gpu2-128-16-1-200
    image: debian-12
    zone: rma1
""",
        encoding="utf-8",
    )
    return config


async def run_command(config: Path, group: str, output: str) -> int:
    return await asyncio.to_thread(template_command, config, group, output)


async def test_prints_the_template_as_yaml(
    emulator: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, emulator.url)
    assert await run_command(config, "workers", "yaml") == 0
    assert yaml.safe_load(capsys.readouterr().out) == EXPECTED_WORKERS


async def test_prints_a_gpu_template_as_json_through_the_cli(
    emulator: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, emulator.url)
    argv = ["template", "--config", str(config), "gpu", "-o", "json"]
    assert await asyncio.to_thread(main, argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["metadata"]["labels"]["cloudscale.ch/gpu"] == "nvidia-rtx-pro-6000-max-q"
    assert document["metadata"]["labels"]["topology.kubernetes.io/region"] == "rma"
    assert document["status"]["capacity"]["nvidia.com/gpu"] == "1"
    assert document["status"]["allocatable"] == {
        "cpu": "16",
        "ephemeral-storage": "9Gi",  # default 10 GB volume minus the default 10%
        "memory": "130972Mi",  # 128Gi minus the default 100Mi
        "nvidia.com/gpu": "1",
        "pods": "110",
    }


async def test_unknown_group_lists_the_groups(
    emulator: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, emulator.url)
    assert await run_command(config, "wokers", "yaml") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert 'unknown node group "wokers"' in captured.err
    assert "configured groups: workers, gpu" in captured.err


async def test_unknown_flavor_is_named(
    emulator: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, emulator.url, flavor="flex-999-1")
    assert await run_command(config, "workers", "yaml") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert 'node group "workers": flavor "flex-999-1" does not exist' in captured.err
    assert "flex-16-8" in captured.err  # the available flavors are listed


async def test_offline_template_reads_the_flavor_slug(
    emulator: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The API refuses (here: the token): the slug still says the size, so the same template.
    config = write_config(tmp_path, emulator.url, token="wrong-token")
    assert await run_command(config, "workers", "yaml") == 0
    captured = capsys.readouterr()
    assert yaml.safe_load(captured.out) == EXPECTED_WORKERS
    assert f"cannot list flavors from {emulator.url}" in captured.err
    assert 'sizes read from the flavor slug "flex-16-8"' in captured.err
    assert "wrong-token" not in captured.err


async def test_cloud_failure_with_an_unreadable_slug_exits_1(
    emulator: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, emulator.url, token="wrong-token", flavor="custom-large")
    assert await run_command(config, "workers", "yaml") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"cannot list flavors from {emulator.url}" in captured.err
    assert "wrong-token" not in captured.err


def test_invalid_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("cluster: prod\nnodeGroups: nope\n", encoding="utf-8")
    assert template_command(config, "workers", "yaml") == 2
    assert "nodeGroups" in capsys.readouterr().err
