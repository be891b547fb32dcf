"""Every label the template promises reaches the real node.

Template labels = what the kubelet sets + what the cloudscale CCM sets + ${node_labels}: a
table over the pure function, and end to end, a GPU group's real create request (its rendered
userData) against its TemplateNodeInfo, over mTLS against the emulator.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from fixtures.emulator import RunningEmulator
from fixtures.stack import StackFactory, group, wait_until

from cloudscale_autoscaler.cloud.models import Flavor, Gpu
from cloudscale_autoscaler.config.advice import config_warnings
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.settings.types import Config, NodeGroupConfig, Taint
from cloudscale_autoscaler.template.labels import label_error, label_sources
from cloudscale_autoscaler.template.node import template_labels

GPU_LABEL = "cloudscale.ch/gpu"
FLEX = Flavor("flex-8-4", "Flex-8-4", 4, 8)
GPU = Flavor("gpu2-128-16-1-200", "GPU2", 16, 128, Gpu(1, "NVIDIA RTX PRO 6000 Max-Q"))
KUBELET_KEYS = {"kubernetes.io/os", "kubernetes.io/arch", "kubernetes.io/hostname"}
BASE = NodeGroupConfig("g", 0, 3, "flex-8-4", "debian-12", zone="rma1")


def ccm_labels(flavor_slug: str, zone: str) -> dict[str, str]:
    """What the cloudscale CCM's InstanceMetadata makes the node controller write."""
    return {
        "node.kubernetes.io/instance-type": flavor_slug,
        "topology.kubernetes.io/zone": zone,
        "topology.kubernetes.io/region": zone.rstrip("0123456789"),
    }


@pytest.mark.parametrize(
    ("group_", "flavor", "node_labels"),
    [
        pytest.param(BASE, FLEX, {}, id="plain"),
        pytest.param(replace(BASE, labels=(("role", "web"),)), FLEX, {"role": "web"}, id="labels"),
        pytest.param(
            replace(BASE, flavor=GPU.slug, labels=(("role", "ml"),)),
            GPU,
            {GPU_LABEL: "nvidia-rtx-pro-6000-max-q", "role": "ml"},
            id="gpu",
        ),
        pytest.param(
            replace(BASE, flavor=GPU.slug, labels=((GPU_LABEL, "custom"),)),
            GPU,
            {GPU_LABEL: "custom"},
            id="gpu-label-overridden",
        ),
        pytest.param(
            replace(BASE, labels=(("topology.kubernetes.io/zone", "rma1"),)),
            FLEX,
            {},
            id="same-value-as-the-ccm",
        ),
    ],
)
def test_template_labels_are_kubelet_ccm_and_node_labels(
    group_: NodeGroupConfig, flavor: Flavor, node_labels: dict[str, str]
) -> None:
    sources = label_sources(group_, flavor, GPU_LABEL)
    assert sources.node_labels == node_labels
    assert set(sources.kubelet) <= KUBELET_KEYS
    expected_ccm = ccm_labels(flavor.slug, "rma1")
    assert sources.ccm.items() <= expected_ccm.items()
    assert set(sources.ccm) | set(node_labels) >= set(expected_ccm)
    assert {**sources.kubelet, **sources.ccm, **sources.node_labels} == template_labels(
        group_, flavor, GPU_LABEL
    )
    # No key comes from two places.
    keys = [*sources.kubelet, *sources.ccm, *sources.node_labels]
    assert len(keys) == len(set(keys))


CCM = "the cloud controller manager sets it on every new node"
REFUSED = "the kubelet refuses to start with"


@pytest.mark.parametrize(
    ("key", "value", "zone", "error"),
    [
        ("node.kubernetes.io/instance-type", "flex-8-4", "rma1", None),
        (
            "node.kubernetes.io/instance-type",
            "big",
            "rma1",
            f'{CCM} to the server\'s flavor, "flex-8-4", not "big"',
        ),
        (
            "beta.kubernetes.io/instance-type",
            "big",
            "rma1",
            f'{CCM} to the server\'s flavor, "flex-8-4", not "big"',
        ),
        ("topology.kubernetes.io/zone", "rma1", "rma1", None),
        (
            "topology.kubernetes.io/zone",
            "lpg1",
            "rma1",
            f'{CCM} from the server\'s zone, to "rma1", not "lpg1"',
        ),
        (
            "failure-domain.beta.kubernetes.io/zone",
            "lpg1",
            "rma1",
            f'{CCM} from the server\'s zone, to "rma1", not "lpg1"',
        ),
        ("topology.kubernetes.io/region", "rma", "rma1", None),
        (
            "topology.kubernetes.io/region",
            "rma1",
            "rma1",
            f'{CCM} from the server\'s zone, to "rma", not "rma1"',
        ),
        (
            "topology.kubernetes.io/zone",
            "rma1",
            None,
            f"{CCM} from the server's zone: set the group's zone instead",
        ),
        (
            "kubernetes.io/hostname",
            "n1",
            "rma1",
            "the kubelet sets it to each node's own host name",
        ),
        ("kubernetes.io/os", "linux", "rma1", None),
        (
            "kubernetes.io/os",
            "windows",
            "rma1",
            'the kubelet sets it to "linux" on every cloudscale.ch node, not "windows"',
        ),
        (
            "kubernetes.io/arch",
            "arm64",
            "rma1",
            'the kubelet sets it to "amd64" on every cloudscale.ch node, not "arm64"',
        ),
        ("node-role.kubernetes.io/worker", "", "rma1", REFUSED),
        ("app.kubernetes.io/name", "web", "rma1", REFUSED),
        ("node-restriction.kubernetes.io/pool", "a", "rma1", REFUSED),
        ("k8s.io/x", "a", "rma1", REFUSED),
        ("example.k8s.io/x", "a", "rma1", REFUSED),
        ("node.kubernetes.io/pool", "a", "rma1", None),
        ("pool.node.kubernetes.io/x", "a", "rma1", None),
        ("kubelet.kubernetes.io/x", "a", "rma1", None),
        ("example.com/tier", "a", "rma1", None),
        ("kubernetes.io.example.com/x", "a", "rma1", None),
        ("role", "web", "rma1", None),
    ],
)
def test_labels_the_nodes_cannot_carry_are_config_errors(
    key: str, value: str, zone: str | None, error: str | None
) -> None:
    """A group label on a key the kubelet or the CCM sets must repeat their value (the CCM
    overwrites it, the kubelet's own value is the truth); the kubelet refuses keys in the
    kubernetes.io and k8s.io namespaces outside its allowed set (k8s.io/kubelet IsKubeletLabel)."""
    got = label_error(key, value, "flex-8-4", zone)
    if error is None or error == REFUSED:
        assert (got is None) == (error is None), got
        assert got is None or got.startswith(f"{REFUSED} {key} in --node-labels"), got
    else:
        assert got == error


def test_group_without_zone_promises_no_zone() -> None:
    sources = label_sources(replace(BASE, zone=None), FLEX, GPU_LABEL)
    assert sources.ccm == {"node.kubernetes.io/instance-type": "flex-8-4"}


def _labels_flag(user_data: str) -> dict[str, str]:
    match = re.search(r"--node-labels=(\S*)", user_data)
    assert match is not None, user_data
    return dict(item.split("=", 1) for item in match[1].split(",") if item)


async def test_a_real_gpu_server_gets_every_template_label(stack: StackFactory) -> None:
    user_data = "#cloud-config\nruncmd:\n  - kubelet --node-labels=${node_labels}\n"
    gpu = group(
        "gpu", 0, 2, flavor=GPU.slug, zone="rma1", labels=(("role", "ml"),), user_data=user_data
    )
    s = await stack([gpu])
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="gpu", delta=1))

    async def created() -> bool:
        return len(await s.cloud_servers("gpu")) == 1

    await wait_until(created, 30, "the GPU server was not created")
    server = (await s.cloud_servers("gpu"))[0]
    record = s.emulator.state.servers[server["uuid"]]
    assert record.user_data is not None
    passed = _labels_flag(record.user_data)
    reply = await s.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id="gpu"))
    template = dict(core_v1_pb2.Node.FromString(reply.nodeBytes).metadata.labels)
    kubelet = {k: v for k, v in template.items() if k in KUBELET_KEYS}
    ccm = ccm_labels(server["flavor"]["slug"], server["zone"]["slug"])
    assert template == {**kubelet, **ccm, **passed}
    assert passed[GPU_LABEL] == "nvidia-rtx-pro-6000-max-q"


async def test_no_gpu_server_is_labelled_unknown_while_flavors_cannot_be_read(
    stack: StackFactory, emulator: RunningEmulator
) -> None:
    """The slug does not name the GPU model: without the flavor list, IncreaseSize refuses a
    GPU group whose userData passes ${node_labels} (UNAVAILABLE, target unchanged) instead
    of creating servers labelled "unknown" for good; the template may say "unknown"."""
    user_data = "#cloud-config\nruncmd:\n  - kubelet --node-labels=${node_labels}\n"
    gpu = group("gpu", 0, 2, flavor=GPU.slug, zone="rma1", user_data=user_data)
    await emulator.admin.set_faults({"error_rate": {"list_flavors": {"rate": 1.0, "status": 503}}})
    s = await stack([gpu])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="gpu", delta=1))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
    assert caught.value.details() == (
        f"node group gpu: the flavor list cannot be read and the slug {GPU.slug} does not name "
        f"its GPU model, so ${{node_labels}} would label the servers {GPU_LABEL}=unknown for "
        "good; not creating servers until the flavor list can be read (every Refresh tries "
        "again)"
    )
    assert await s.target("gpu") == 0
    assert await s.cloud_servers("gpu") == []
    reply = await s.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id="gpu"))
    template = core_v1_pb2.Node.FromString(reply.nodeBytes)
    assert template.metadata.labels[GPU_LABEL] == "unknown"
    # Once the list can be read, a Refresh gets it (a fetch still in its retries' backoff may
    # take the next one: Refresh waits at most a second for it) and creating goes ahead.
    await emulator.admin.set_faults({})

    async def refreshed() -> bool:
        await s.refresh()
        return "200" in (await emulator.admin.stats()).get("list_flavors", {})

    await wait_until(refreshed, 30, "no Refresh fetched the flavors again")
    await s.refresh()
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="gpu", delta=1))
    assert await s.target("gpu") == 1


@pytest.mark.parametrize(
    ("group_", "expected"),
    [
        (BASE, []),
        (replace(BASE, labels=(("role", "web"),)), ["has labels but it has no userData for"]),
        (replace(BASE, flavor=GPU.slug), ["has a GPU flavor but it has no userData for"]),
        (
            replace(BASE, flavor=GPU.slug, labels=(("a", "b"),), user_data="${node_taints}"),
            ["has labels and a GPU flavor but its userData does not use ${node_labels}"],
        ),
        (replace(BASE, flavor=GPU.slug, user_data="x ${node_labels}"), []),
        (
            replace(BASE, taints=(Taint("k", "", "NoSchedule"),), user_data="${node_labels}"),
            ["has taints but its userData does not use ${node_taints}"],
        ),
        (
            replace(
                BASE,
                labels=(("a", "b"),),
                taints=(Taint("k", "", "NoSchedule"),),
                user_data="--node-labels=${node_labels} --register-with-taints=${node_taints}",
            ),
            [],
        ),
    ],
)
def test_check_config_warns_when_labels_cannot_reach_nodes(
    group_: NodeGroupConfig, expected: list[str]
) -> None:
    config = Config(cluster="c", node_groups=(group_,), state_dir=Path("/var/lib/x"))
    warnings = config_warnings(config)
    assert len(warnings) == len(expected)
    for warning, part in zip(warnings, expected, strict=True):
        assert warning.startswith("nodeGroups[0] (g): ") and part in warning, warning


async def test_serve_logs_the_config_warnings(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    await stack([group("workers", 0, 3, labels=(("role", "web"),))])
    assert "has labels but it has no userData for ${node_labels}" in caplog.text
