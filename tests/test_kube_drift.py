"""Template drift against a real kube-apiserver: Node objects created through the API (status
through the status subresource), the provider reading them with the service account's RBAC
from deploy/, mapped to groups through the emulator's servers.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.kube import NAMESPACE, NEEDS_KUBE, Kube
from fixtures.stack import CLUSTER, StackFactory, group, group_tags, wait_until
from fixtures.tools import run_cli
from kubernetes import client as k8s

from cloudscale_autoscaler.kube.check import template_of
from cloudscale_autoscaler.settings.types import KubeletConfig, KubernetesConfig

pytestmark = [pytest.mark.kube, NEEDS_KUBE]
PLUGIN_SECONDS = 3.0  # an exec credential plugin this slow (a token from a remote vault)
Node = dict[str, Any]
WORKERS = group(
    "workers",
    flavor="flex-8-4",
    labels=(("role", "worker"),),
    kubelet=KubeletConfig(system_reserved=(("memory", "512Mi"),)),
)


def live_node(template: Node, name: str, server_uuid: str) -> Node:
    """What a healthy kubelet of this template registers: same labels, capacity, allocatable."""
    node = copy.deepcopy(template)
    labels = {**node["metadata"]["labels"], "kubernetes.io/hostname": name}
    node["metadata"] = {"name": name, "labels": labels}
    node["spec"] = {"providerID": f"cloudscale://{server_uuid}", "taints": []}
    node["status"] = {
        "capacity": node["status"]["capacity"],
        "allocatable": node["status"]["allocatable"],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return node


def create_node(api: k8s.ApiClient, node: Node) -> None:
    core = k8s.CoreV1Api(api)
    status = node["status"]
    core.create_node({**node, "status": {}})
    current = core.read_node(node["metadata"]["name"])
    current.status = k8s.V1NodeStatus(
        capacity=status["capacity"],
        allocatable=status["allocatable"],
        conditions=[k8s.V1NodeCondition(**c) for c in status["conditions"]],
    )
    core.replace_node_status(node["metadata"]["name"], current)


class Nodes:
    """Nodes this test creates (the apiserver is shared by the session), deleted afterwards."""

    def __init__(self, kube: Kube) -> None:
        self.api = kube.client()
        self.names: list[str] = []

    async def create(self, node: Node) -> str:
        await asyncio.to_thread(create_node, self.api, node)
        self.names.append(node["metadata"]["name"])
        return str(node["metadata"]["name"])

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(k8s.CoreV1Api(self.api).delete_node, name)
        self.names.remove(name)


@pytest.fixture
async def nodes(kube: Kube) -> AsyncIterator[Nodes]:
    created = Nodes(kube)
    yield created
    for name in list(created.names):
        await created.delete(name)
    created.api.close()


async def arrange(stack: StackFactory, kube: Kube, nodes: Nodes, emulator: RunningEmulator) -> Any:
    """A provider with the kubernetes section (service account kubeconfig) and five Nodes:
    one like the template, one 10% short of allocatable memory, one without the group's
    label, one of a server that is not ours, one still uninitialized."""
    settings = KubernetesConfig(kubeconfig=kube.provider_kubeconfig, drift_interval_seconds=0)
    s = await stack(groups=[WORKERS], kubernetes=settings)
    template = await template_of(s.provider.service.engine, "workers")
    suffix = uuid.uuid4().hex[:6]
    servers = [
        await emulator.admin.create_server(f"w-{i}", tags=group_tags("workers"), zone="lpg1")
        for i in range(4)
    ]
    stranger = await emulator.admin.create_server("other", tags={"k8s-cluster": "elsewhere"})
    await s.refresh()

    def variant(index: int, change: Callable[[Node], None]) -> Node:
        node = live_node(template, f"{kind[index]}-{suffix}", servers[index]["uuid"])
        change(node)
        return node

    kind = ["match", "short", "unlabeled", "new"]
    await nodes.create(variant(0, lambda n: None))
    await nodes.create(variant(1, lambda n: n["status"]["allocatable"].update(memory="6822Mi")))
    await nodes.create(variant(2, lambda n: n["metadata"]["labels"].pop("role")))
    await nodes.create(live_node({**template}, f"stranger-{suffix}", stranger["uuid"]))

    def coming_up(node: Node) -> None:  # not initialized by the CCM yet: no labels from it
        node["metadata"]["labels"] = {"kubernetes.io/hostname": node["metadata"]["name"]}
        node["spec"]["taints"] = [
            {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true",
             "effect": "NoSchedule"}
        ]  # fmt: skip

    await nodes.create(variant(3, coming_up))
    return s, suffix


async def test_drift_check_reports_gauges_and_warnings(
    stack: StackFactory,
    kube: Kube,
    nodes: Nodes,
    emulator: RunningEmulator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    s, suffix = await arrange(stack, kube, nodes, emulator)
    link = s.provider.link
    assert link is not None and not link.elects
    watch_logger = "cloudscale_autoscaler.kube.watch"
    with caplog.at_level(logging.WARNING, logger=watch_logger):
        report = await link.watch.check_once()
    (workers,) = report.groups
    assert workers.nodes == 3, "the stranger's node is not ours, the new one not settled"
    by_field = {d.field: d for d in workers.drifts}
    assert set(by_field) == {"allocatable.memory", 'labels["role"]'}
    memory = by_field["allocatable.memory"]
    assert (memory.node, memory.difference.template, memory.difference.live) == (
        f"short-{suffix}",
        "7580Mi",
        "6822Mi",
    )
    assert memory.advice == "raise nodeGroups[0].kubelet.systemReserved.memory by 758Mi"
    assert by_field['labels["role"]'].node == f"unlabeled-{suffix}"
    assert workers.differing == {
        "resources": {f"short-{suffix}"},
        "labels": {f"unlabeled-{suffix}"},
    }

    warnings = [r.getMessage() for r in caplog.records if r.name == watch_logger]
    assert len(warnings) == 2, warnings
    assert any(f"node short-{suffix} reports 6822Mi (-10.0%)" in w for w in warnings), warnings
    assert any(f"node unlabeled-{suffix} reports (absent)" in w for w in warnings), warnings

    registry = s.provider.metrics.registry
    ratio = registry.get_sample_value(
        "cloudscale_autoscaler_template_drift_ratio",
        {"group": "workers", "resource": "allocatable.memory"},
    )
    assert ratio == pytest.approx((6822 - 7580) / 7580)
    assert registry.get_sample_value(
        "cloudscale_autoscaler_template_drift_ratio",
        {"group": "workers", "resource": "capacity.cpu"},
    ) == pytest.approx(0.0)
    for kind, count in (("resources", 1), ("labels", 1), ("taints", 0)):
        labels = {"group": "workers", "kind": kind}
        assert (
            registry.get_sample_value("cloudscale_autoscaler_template_drift_nodes", labels) == count
        )
    assert (
        registry.get_sample_value(
            "cloudscale_autoscaler_template_drift_checked_nodes", {"group": "workers"}
        )
        == 3
    )


async def test_drift_found_is_an_event_per_group_and_field_on_the_providers_pod(
    stack: StackFactory,
    kube: Kube,
    nodes: Nodes,
    emulator: RunningEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = f"provider-{uuid.uuid4().hex[:6]}"
    for variable, value in (("POD_NAME", pod), ("POD_NAMESPACE", NAMESPACE), ("POD_UID", pod)):
        monkeypatch.setenv(variable, value)  # the downward API's, read when the link starts
    s, suffix = await arrange(stack, kube, nodes, emulator)
    link = s.provider.link
    assert link is not None
    await link.watch.check_once()
    await link.watch.check_once()  # the same drift again: counted, not a new Event
    selector = f"involvedObject.name={pod},involvedObject.uid={pod},reason=TemplateDrift"
    core = k8s.CoreV1Api(kube.client())
    found: list[Any] = []

    async def both_counted_twice() -> bool:
        listed = await asyncio.to_thread(
            core.list_namespaced_event, NAMESPACE, field_selector=selector
        )
        found[:] = listed.items
        return sorted(e.count for e in found) == [2, 2]

    await wait_until(both_counted_twice, 30, "no two TemplateDrift Events counted twice")
    messages = sorted(e.message for e in found)
    assert messages[0].startswith(
        "template drift in node group workers, allocatable.memory: template 7580Mi, "
        f"node short-{suffix} reports 6822Mi (-10.0%)"
    ), messages
    assert messages[1].startswith(
        'template drift in node group workers, labels["role"]: template worker, '
        f"node unlabeled-{suffix} reports (absent)"
    ), messages
    assert {e.type for e in found} == {"Warning"}


def write_drift_config(tmp_path: Path, emulator: RunningEmulator, kubeconfig: Path | None) -> Path:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    document: dict[str, Any] = {
        "cluster": CLUSTER,
        "tls": {"insecure": True},
        "cloudscale": {"url": emulator.url, "tokenFile": str(token)},
        "nodeGroups": [
            {"name": "workers", "minSize": 0, "maxSize": 10, "flavor": "flex-8-4",
             "image": "debian-12", "zone": "lpg1", "labels": {"role": "worker"},
             "kubelet": {"systemReserved": {"memory": "512Mi"}}},
        ],
    }  # fmt: skip
    if kubeconfig is not None:
        document["kubernetes"] = {"kubeconfig": str(kubeconfig)}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


async def test_drift_command_prints_the_table_and_exits_by_verdict(
    stack: StackFactory, kube: Kube, nodes: Nodes, emulator: RunningEmulator, tmp_path: Path
) -> None:
    _, suffix = await arrange(stack, kube, nodes, emulator)
    config = write_drift_config(tmp_path, emulator, kube.provider_kubeconfig)

    drifted = await asyncio.to_thread(run_cli, "drift", "--config", str(config))
    assert drifted.returncode == 1, drifted.stderr
    rows = [line.split() for line in drifted.stdout.splitlines()]
    assert rows[0] == ["GROUP", "NODES", "FIELD", "TEMPLATE", "LIVE", "NODE", "DIFF"]
    assert ["workers", "3", "allocatable.memory", "7580Mi", "6822Mi", f"short-{suffix}", "-10.0%",
            "DRIFT"] in rows  # fmt: skip
    assert [
        "workers",
        "3",
        "capacity.memory",
        "8Gi",
        "8Gi",
        f"match-{suffix}",
        "+0.0%",
        "info",
    ] in rows
    assert [
        "workers",
        "3",
        'labels["role"]',
        "worker",
        "(absent)",
        f"unlabeled-{suffix}",
        "DRIFT",
    ] in rows
    assert "raise nodeGroups[0].kubelet.systemReserved.memory by 758Mi" in drifted.stdout

    await nodes.delete(f"short-{suffix}")
    await nodes.delete(f"unlabeled-{suffix}")
    # The kubeconfig flag wins over the config's (which now names the cluster admin).
    config = write_drift_config(tmp_path, emulator, kube.admin_kubeconfig)
    clean = await asyncio.to_thread(
        run_cli, "drift", "--config", str(config), "--kubeconfig", str(kube.provider_kubeconfig)
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "No drift" in clean.stdout
    assert ["workers", "1", "allocatable.memory", "7580Mi", "7580Mi", f"match-{suffix}", "+0.0%",
            "ok"] in [line.split() for line in clean.stdout.splitlines()]  # fmt: skip


async def test_drift_command_errors_exit_2_naming_the_cause(
    kube: Kube, emulator: RunningEmulator, tmp_path: Path
) -> None:
    config = write_drift_config(tmp_path, emulator, None)
    forbidden = await asyncio.to_thread(
        run_cli, "drift", "--config", str(config), "--kubeconfig", str(kube.nobody_kubeconfig)
    )
    assert forbidden.returncode == 2
    assert 'nodes is forbidden: User "nobody" cannot list resource "nodes"' in forbidden.stderr
    assert "Traceback" not in forbidden.stderr

    missing = await asyncio.to_thread(
        run_cli, "drift", "--config", str(config), "--kubeconfig", str(tmp_path / "nope")
    )
    assert missing.returncode == 2
    assert f"cannot use kubeconfig {tmp_path / 'nope'}" in missing.stderr

    (tmp_path / "bad.yaml").write_text("cluster: prod\n")
    bad = await asyncio.to_thread(run_cli, "drift", "--config", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 2 and "nodeGroups: required" in bad.stderr


async def test_drift_command_against_a_closed_port_says_so_in_one_line(
    emulator: RunningEmulator, tmp_path: Path
) -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    config = write_drift_config(tmp_path, emulator, kubeconfig)
    closed = await asyncio.to_thread(run_cli, "drift", "--config", str(config))
    assert closed.returncode == 2
    # One line naming the API, no urllib3 retry warnings, no traceback.
    assert closed.stderr.splitlines() == [
        line for line in closed.stderr.splitlines() if line.startswith("error: ")
    ]
    assert len(closed.stderr.splitlines()) == 1, closed.stderr
    assert f"https://127.0.0.1:{port} unreachable" in closed.stderr


async def test_reading_the_kubeconfig_does_not_hold_up_the_event_loop(
    stack: StackFactory, tmp_path: Path
) -> None:
    """An exec credential plugin runs while the kubeconfig is read: in a worker thread, so
    the event loop (the gRPC server of a running process) keeps turning meanwhile."""
    credential = (
        '{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", '
        '"status": {"token": "t"}}'
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "sh",
                                "args": ["-c", f"sleep {PLUGIN_SECONDS}; echo '{credential}'"],
                            }
                        },
                    }
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    beats: list[float] = []

    async def heartbeat() -> None:
        while True:
            beats.append(time.monotonic())
            await asyncio.sleep(0.05)

    beating = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)  # the first beat
    try:
        settings = KubernetesConfig(kubeconfig=kubeconfig, drift_interval_seconds=0)
        started = time.monotonic()
        await stack(groups=[WORKERS], kubernetes=settings)
        beats.append(time.monotonic())
        assert beats[-1] - started >= PLUGIN_SECONDS, "the plugin did not run"
    finally:
        beating.cancel()
    longest = max(later - earlier for earlier, later in itertools.pairwise(beats))
    assert longest < PLUGIN_SECONDS - 0.5, f"the event loop stood still for {longest:.1f} s"
