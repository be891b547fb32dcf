"""Prices for CA's price expander: the `pricing` config, exact answers for known intervals
(table tests), both proto generations over mTLS, and CA's expander arithmetic picking the
cheaper of two groups that fit the same pods."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.stack import Stack, StackFactory, group
from test_check_config import write_config

from cloudscale_autoscaler.cli import main
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.engine.pricing import (
    Offer,
    cheapest_pod_price,
    dominant_share,
    pod_requests,
    price_for,
)
from cloudscale_autoscaler.observability.echo import ECHO_LIMIT
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.settings.types import ConfigError, PricingConfig
from cloudscale_autoscaler.template.node import ANNOTATION_CLUSTER, ANNOTATION_GROUP

MI = 2**20
GI = 2**30
START = 1_800_000_000  # a Unix time in seconds

# --- config ---------------------------------------------------------------------------------


def load(tmp_path: Path, pricing: Any, flavor: str = "flex-8-4") -> Any:
    doc = {
        "cluster": "prod",
        "tls": {"insecure": True},
        "cloudscale": {"url": "http://127.0.0.1:1/v1", "tokenFile": "token"},
        "pricing": pricing,
        "nodeGroups": [
            {"name": "w", "minSize": 0, "maxSize": 3, "flavor": flavor, "image": "d"},
        ],
    }
    (tmp_path / "token").write_text("t0123456789\n")
    (tmp_path / "token").chmod(0o600)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_config(path)


def test_pricing_is_read_as_exact_decimals(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        {
            "currency": "CHF",
            "flavorsPerHour": {"flex-8-4": 0.0913, "plus-16-4": "0.2104"},
            "volumePerGBHour": 0.000125,
        },
    )
    assert config.pricing == PricingConfig(
        currency="CHF",
        flavors=(("flex-8-4", Decimal("0.0913")), ("plus-16-4", Decimal("0.2104"))),
        volume_gb=Decimal("0.000125"),
    )


def test_no_pricing_section_means_no_prices(tmp_path: Path) -> None:
    doc_without = load(tmp_path, None)
    assert doc_without.pricing is None


@pytest.mark.parametrize(
    ("pricing", "errors"),
    [
        (
            {"flavorsPerHour": {"flex-8-4": 1}, "volumePerGBHour": 0},
            ["pricing.currency: required"],
        ),
        (
            {"currency": "chf", "flavorsPerHour": {"flex-8-4": 1}, "volumePerGBHour": 0},
            ['pricing.currency: invalid currency "chf": expected an ISO 4217 code such as CHF'],
        ),
        (
            {"currency": "CHF", "flavorsPerHour": {"flex-8-4": -1}, "volumePerGBHour": 0},
            ["pricing.flavorsPerHour.flex-8-4: must not be negative, got -1"],
        ),
        (
            {"currency": "CHF", "flavorsPerHour": {"flex-8-4": "cheap"}, "volumePerGBHour": 0},
            [
                'pricing.flavorsPerHour.flex-8-4: invalid price "cheap": expected a decimal '
                "number such as 0.0913"
            ],
        ),
        (
            {"currency": "CHF", "flavorsPerHour": {"flex-8-4": True}, "volumePerGBHour": 0},
            [
                "pricing.flavorsPerHour.flex-8-4: expected a price (a number such as 0.0913), "
                "got boolean true"
            ],
        ),
        (
            {"currency": "CHF", "flavorsPerHour": {"flex-8-4": ".nan"}, "volumePerGBHour": 0},
            [
                'pricing.flavorsPerHour.flex-8-4: invalid price ".nan": expected a decimal number '
                "such as 0.0913"
            ],
        ),
        (
            {"currency": "CHF", "flavorsPerHour": {"flex-8-4": 1}},
            ["pricing.volumePerGBHour: required: the price per GB of volume per hour (0 if free)"],
        ),
        (
            {"currency": "CHF", "flavorsPerHour": {"plus-8-2": 1}, "volumePerGBHour": 0},
            [
                'pricing.flavorsPerHour.flex-8-4: no price for flavor "flex-8-4" of '
                'nodeGroups[0] ("w"): CA\'s price expander would never choose that group'
            ],
        ),
        (
            {"currency": "CHF", "flavors": {"flex-8-4": 1}, "volumePerGBHour": 0},
            [
                'pricing.flavors: unknown key; did you mean "flavorsPerHour"?',
                "pricing.flavorsPerHour: required: a price per hour per flavor",
            ],
        ),
        ("CHF", ['pricing: expected a mapping, got string "CHF"']),
        # Finite as a decimal but not as a double: both pricing RPCs would overflow.
        (
            {"currency": "CHF", "flavorsPerHour": {"flex-8-4": "1.0e+400"}, "volumePerGBHour": 0},
            ["pricing.flavorsPerHour.flex-8-4: must be at most 1000000, got 1.0e+400"],
        ),
        (
            {"currency": "CHF", "flavorsPerHour": {"flex-8-4": 1}, "volumePerGBHour": 1e300},
            ["pricing.volumePerGBHour: must be at most 1000000, got 1e+300"],
        ),
    ],
)
def test_pricing_errors(tmp_path: Path, pricing: Any, errors: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, pricing)
    assert caught.value.errors == errors


# --- pure arithmetic (table tests) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("hourly", "seconds", "expected"),
    [
        (Decimal("0.1213"), Fraction(3600), Fraction(1213, 10000)),
        (Decimal("0.1213"), Fraction(5400), Fraction(1213 * 3, 20000)),
        # Billing is per second: half a second is half a second, not a rounded minute.
        (Decimal("0.36"), Fraction(1, 2), Fraction(1, 20000)),
        (Decimal("0.1"), Fraction(0), Fraction(0)),
        (Decimal("0"), Fraction(3600), Fraction(0)),
    ],
)
def test_price_for_an_interval_is_exact(
    hourly: Decimal, seconds: Fraction, expected: Fraction
) -> None:
    assert price_for(hourly, seconds) == expected


def container(**requests: str) -> core_v1_pb2.Container:
    c = core_v1_pb2.Container(name="c")
    for name, value in requests.items():
        c.resources.requests[name.replace("_", "-")].string = value
    return c


def sidecar(**requests: str) -> core_v1_pb2.Container:
    c = container(**requests)
    c.restartPolicy = "Always"
    return c


def pod(
    containers: list[core_v1_pb2.Container],
    init: list[core_v1_pb2.Container] | None = None,
    overhead: dict[str, str] | None = None,
    pod_level: dict[str, str] | None = None,
) -> core_v1_pb2.Pod:
    p = core_v1_pb2.Pod()
    p.metadata.name, p.metadata.namespace = "p", "default"
    p.spec.containers.extend(containers)
    p.spec.initContainers.extend(init or [])
    for name, value in (overhead or {}).items():
        p.spec.overhead[name].string = value
    for name, value in (pod_level or {}).items():
        p.spec.resources.requests[name].string = value
    return p


@pytest.mark.parametrize(
    ("the_pod", "expected"),
    [
        (pod([container(cpu="500m", memory="500Mi")]), {"cpu": Fraction(1, 2), "memory": 500 * MI}),
        (
            pod([container(cpu="250m"), container(cpu="250m", memory="1Gi")]),
            {"cpu": Fraction(1, 2), "memory": GI},
        ),
        # An init container runs alone before the others: the maximum counts, not the sum.
        (
            pod([container(cpu="500m")], init=[container(cpu="2", memory="64Mi")]),
            {"cpu": Fraction(2), "memory": 64 * MI},
        ),
        (
            pod([container(cpu="100m")], overhead={"cpu": "50m", "memory": "10Mi"}),
            {"cpu": Fraction(3, 20), "memory": 10 * MI},
        ),
        (
            pod([container(cpu="100m", memory="1Gi")], pod_level={"cpu": "1"}),
            {"cpu": Fraction(1), "memory": GI},
        ),
        # Sidecars (restartPolicy Always) keep running: they add to the containers, and an
        # init container after them runs alongside them.
        (
            pod(
                [container(cpu="1")],
                init=[sidecar(cpu="500m"), container(cpu="1", memory="1Gi")],
            ),
            {"cpu": Fraction(3, 2), "memory": GI},
        ),
        (
            pod([container(cpu="100m")], init=[sidecar(cpu="200m"), container(cpu="2")]),
            {"cpu": Fraction(11, 5)},
        ),
        (pod([container()]), {}),
    ],
)
def test_pod_requests(the_pod: core_v1_pb2.Pod, expected: dict[str, Fraction]) -> None:
    assert pod_requests(the_pod) == expected


ALLOC = {"cpu": Fraction(4), "memory": Fraction(16 * GI), "pods": Fraction(110)}


@pytest.mark.parametrize(
    ("requests", "allocatable", "expected"),
    [
        ({"cpu": Fraction(1, 2), "memory": Fraction(500 * MI)}, ALLOC, Fraction(1, 8)),
        ({"memory": Fraction(8 * GI)}, ALLOC, Fraction(1, 2)),
        ({}, ALLOC, Fraction(1, 110)),  # a pod slot at least
        ({"nvidia.com/gpu": Fraction(1)}, ALLOC, None),  # the node has no GPU
        ({"nvidia.com/gpu": Fraction(1)}, {**ALLOC, "nvidia.com/gpu": Fraction(2)}, Fraction(1, 2)),
    ],
)
def test_dominant_share(
    requests: dict[str, Fraction], allocatable: dict[str, Fraction], expected: Fraction | None
) -> None:
    assert dominant_share(requests, allocatable) == expected


def test_pod_price_is_the_cheapest_fitting_group() -> None:
    cheap = Offer("cheap", Decimal("0.20"), ALLOC)
    dear = Offer("dear", Decimal("0.30"), {**ALLOC, "nvidia.com/gpu": Fraction(1)})
    small = {"cpu": Fraction(1)}
    assert cheapest_pod_price(small, [cheap, dear], Fraction(3600)) == Fraction(5, 100)
    gpu = {"cpu": Fraction(1), "nvidia.com/gpu": Fraction(1)}
    assert cheapest_pod_price(gpu, [cheap, dear], Fraction(1800)) == Fraction(15, 100)
    assert cheapest_pod_price({"hugepages-2Mi": Fraction(1)}, [cheap, dear], Fraction(1)) is None


# --- the RPCs over mTLS ---------------------------------------------------------------------

PRICING = PricingConfig(
    currency="CHF",
    flavors=(("flex-16-4", Decimal("0.1826")), ("plus-16-4", Decimal("0.4208"))),
    volume_gb=Decimal("0.000125"),
)


def hourly(flavor: str, volume_gb: int) -> Fraction:
    return Fraction(PRICING.flavor(flavor)) + Fraction(PRICING.volume_gb) * volume_gb  # type: ignore[arg-type]


def node_request(node: pb.ExternalGrpcNode, seconds: int, *, old: bool, new: bool) -> Any:
    request = pb.PricingNodePriceRequest(node=node)
    if old:
        request.startTime.seconds, request.endTime.seconds = START, START + seconds
    if new:
        request.startTimestamp.seconds, request.endTimestamp.seconds = START, START + seconds
    return request


def pod_request(the_pod: core_v1_pb2.Pod, seconds: int, *, old: bool, new: bool) -> Any:
    request = pb.PricingPodPriceRequest()
    if old:
        request.pod.CopyFrom(the_pod)
        request.startTime.seconds, request.endTime.seconds = START, START + seconds
    if new:
        request.pod_bytes = the_pod.SerializeToString(deterministic=True)
        request.startTimestamp.seconds, request.endTimestamp.seconds = START, START + seconds
    return request


async def priced_stack(stack: StackFactory) -> Stack:
    return await stack(
        groups=[
            group("cheap", 0, 5, flavor="flex-16-4", volume_size_gb=50),
            group("dear", 0, 5, flavor="plus-16-4", volume_size_gb=50),
        ],
        pricing=PRICING,
    )


async def template_node(s: Stack, group_id: str) -> pb.ExternalGrpcNode:
    """What CA sends for a template: name, labels and annotations (CA renames the node)."""
    reply = await s.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group_id))
    node = core_v1_pb2.Node.FromString(reply.nodeBytes)
    return pb.ExternalGrpcNode(
        name=f"template-node-for-{group_id}-1234",
        labels=dict(node.metadata.labels),
        annotations=dict(node.metadata.annotations),
    )


async def refusal(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


GENERATIONS = [
    pytest.param(True, False, id="old-fields"),
    pytest.param(True, True, id="both"),
    pytest.param(False, True, id="new-fields"),
]


@pytest.mark.parametrize(("old", "new"), GENERATIONS)
async def test_node_price_of_a_template_node_is_exact(
    stack: StackFactory, old: bool, new: bool
) -> None:
    s = await priced_stack(stack)
    node = await template_node(s, "cheap")
    for seconds in (3600, 5400, 61):
        reply = await s.stub.PricingNodePrice(node_request(node, seconds, old=old, new=new))
        assert reply.price == float(hourly("flex-16-4", 50) * seconds / 3600)


async def test_node_price_by_provider_id_labels_and_annotations(stack: StackFactory) -> None:
    s = await priced_stack(stack)
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="dear", delta=1))
    await s.settle("dear")
    [instance] = await s.instances("dear")
    dear = float(hourly("plus-16-4", 50))
    by_id = pb.ExternalGrpcNode(providerID=instance.id, name="dear-1")
    by_annotation = pb.ExternalGrpcNode(
        name="x", annotations={ANNOTATION_GROUP: "dear", ANNOTATION_CLUSTER: s.config.cluster}
    )
    by_labels = pb.ExternalGrpcNode(
        name="x",
        labels={
            "node.kubernetes.io/instance-type": "plus-16-4",
            "topology.kubernetes.io/zone": "lpg1",
        },
    )
    by_beta_labels = pb.ExternalGrpcNode(
        name="x", labels={"beta.kubernetes.io/instance-type": "plus-16-4"}
    )
    for node in (by_id, by_annotation, by_labels, by_beta_labels):
        reply = await s.stub.PricingNodePrice(node_request(node, 3600, old=False, new=True))
        assert reply.price == dear, node


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (
            pb.ExternalGrpcNode(
                providerID="cloudscale://00000000-0000-4000-8000-000000000000", name="n"
            ),
            "node n (providerID cloudscale://00000000-0000-4000-8000-000000000000) is not a "
            "server of any node group and carries no node.kubernetes.io/instance-type label "
            "to price it by",
        ),
        (
            pb.ExternalGrpcNode(name="n", labels={"node.kubernetes.io/instance-type": "flex-4-1"}),
            "node n (providerID empty) is not a server of any node group, and no node group "
            "has flavor flex-4-1",
        ),
        (
            pb.ExternalGrpcNode(
                name="n",
                labels={
                    "node.kubernetes.io/instance-type": "flex-16-4",
                    "topology.kubernetes.io/zone": "rma1",
                },
            ),
            "node n (providerID empty) is not a server of any node group, and no node group "
            "has flavor flex-16-4 in zone rma1",
        ),
        (
            pb.ExternalGrpcNode(
                name="n", annotations={ANNOTATION_GROUP: "cheap", ANNOTATION_CLUSTER: "other"}
            ),
            "node n (providerID empty) is not a server of any node group and carries no "
            "node.kubernetes.io/instance-type label to price it by",
        ),
    ],
)
async def test_unknown_node_is_not_found(
    stack: StackFactory, node: pb.ExternalGrpcNode, message: str
) -> None:
    s = await priced_stack(stack)
    error = await refusal(s.stub.PricingNodePrice(node_request(node, 3600, old=True, new=True)))
    assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, message)


async def test_same_flavor_with_different_prices_is_ambiguous(stack: StackFactory) -> None:
    s = await stack(
        groups=[
            group("a", 0, 5, flavor="flex-16-4", volume_size_gb=10),
            group("b", 0, 5, flavor="flex-16-4", volume_size_gb=100),
        ],
        pricing=PRICING,
    )
    node = pb.ExternalGrpcNode(name="n", labels={"node.kubernetes.io/instance-type": "flex-16-4"})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingNodePrice(node_request(node, 3600, old=False, new=True))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details().endswith(
        "the node groups with flavor flex-16-4 (a, b) have different prices"
    )


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            pb.PricingNodePriceRequest(node=pb.ExternalGrpcNode(name="n")),
            "missing interval: expected startTimestamp and endTimestamp (or the older startTime "
            "and endTime)",
        ),
    ],
)
async def test_bad_node_price_requests(stack: StackFactory, request_: Any, message: str) -> None:
    s = await priced_stack(stack)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingNodePrice(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == message


async def test_backwards_interval_is_invalid(stack: StackFactory) -> None:
    s = await priced_stack(stack)
    node = await template_node(s, "cheap")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingNodePrice(node_request(node, -60, old=False, new=True))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ends" in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingPodPrice(pb.PricingPodPriceRequest(pod_bytes=b"\xff\xff"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def allocatable_share(cpu: Fraction, memory: int, flavor_gib: int, vcpus: int) -> Fraction:
    """The dominant share on a default-kubelet node: memory loses the 100Mi eviction
    threshold, one pod slot of 110 at least."""
    return max(cpu / vcpus, Fraction(memory, flavor_gib * GI - 100 * MI), Fraction(1, 110))


@pytest.mark.parametrize(("old", "new"), GENERATIONS)
async def test_pod_price_is_exact(stack: StackFactory, old: bool, new: bool) -> None:
    s = await priced_stack(stack)
    the_pod = pod([container(cpu="500m", memory="500Mi")])
    reply = await s.stub.PricingPodPrice(pod_request(the_pod, 3600, old=old, new=new))
    share = allocatable_share(Fraction(1, 2), 500 * MI, 16, 4)
    assert reply.price == float(hourly("flex-16-4", 50) * share)


async def test_without_pricing_both_rpcs_stay_unimplemented(stack: StackFactory) -> None:
    s = await stack(groups=[group("cheap", 0, 5, flavor="flex-16-4")])
    node = await template_node(s, "cheap")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingNodePrice(node_request(node, 3600, old=True, new=True))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert caught.value.details() == "PricingNodePrice is not implemented: no prices"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingPodPrice(pod_request(pod([container()]), 3600, old=True, new=True))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert caught.value.details() == "PricingPodPrice is not implemented: no prices"


# --- CA's price expander, reproduced from the RPC answers ---------------------------------------


# (group, node count, the pods the option schedules), as CA's expander.Option
Option = tuple[str, int, list[core_v1_pb2.Pod]]


async def expander_choice(
    s: Stack, options: list[Option], constant_pod_price: float | None = None
) -> str:
    """expander/price/price.go's BestOption: per option, score = suppressed unfitness x
    (count x nodePrice + stab) / (sum of podPrices + stab), where stab is the price of a
    500m/500Mi pod, suppressed = (unfitness - 1) x (1 - tanh((count - 1) / 15)) + 1, and
    unfitness is against CA's preferred node for a small cluster (1 CPU); lowest wins.
    `constant_pod_price` replaces every PodPrice answer, to show what a model that ignored the
    pod would choose."""

    async def pod_price(p: core_v1_pb2.Pod) -> float:
        if constant_pod_price is not None:
            return constant_pod_price
        return (await s.stub.PricingPodPrice(pod_request(p, 3600, old=True, new=True))).price

    stab = await pod_price(pod([container(cpu="500m", memory="500Mi")]))
    scores = {}
    for group_id, count, pods in options:
        node = await template_node(s, group_id)
        node_price = (
            await s.stub.PricingNodePrice(node_request(node, 3600, old=True, new=True))
        ).price
        pod_total = sum([await pod_price(p) for p in pods])
        reply = await s.stub.NodeGroupTemplateNodeInfo(
            pb.NodeGroupTemplateNodeInfoRequest(id=group_id)
        )
        cpu = float(core_v1_pb2.Node.FromString(reply.nodeBytes).status.capacity["cpu"].string)
        unfitness = max(1.0 / cpu, cpu / 1.0)
        suppressed = (unfitness - 1.0) * (1.0 - math.tanh((count - 1) / 15.0)) + 1.0
        scores[group_id] = suppressed * (count * node_price + stab) / (pod_total + stab)
    return min(scores, key=lambda g: scores[g])


@pytest.mark.parametrize(
    ("flex", "plus", "winner"),
    [("0.1826", "0.4208", "cheap"), ("0.4208", "0.1826", "dear")],
)
async def test_price_expander_picks_the_cheaper_group(
    stack: StackFactory, flex: str, plus: str, winner: str
) -> None:
    # Both flavors have 4 vCPUs and 16 GB: both fit the pods and unfitness is equal, so only
    # the price decides; swapping the prices swaps the choice.
    pricing = PricingConfig(
        "CHF", (("flex-16-4", Decimal(flex)), ("plus-16-4", Decimal(plus))), Decimal("0.000125")
    )
    s = await stack(
        groups=[
            group("cheap", 0, 5, flavor="flex-16-4", volume_size_gb=50),
            group("dear", 0, 5, flavor="plus-16-4", volume_size_gb=50),
        ],
        pricing=pricing,
    )
    pods = [pod([container(cpu="1", memory="2Gi")]) for _ in range(3)]
    assert await expander_choice(s, [("cheap", 1, pods), ("dear", 1, pods)]) == winner


async def test_price_expander_weighs_what_each_option_schedules(stack: StackFactory) -> None:
    # The cheap group's node would run only a small pod, the dear group's node a big one: per
    # unit of work the dear option is the better buy, which only a PodPrice that follows the
    # pod's requests can tell. A PodPrice that ignored the pod would pick the cheap node.
    s = await priced_stack(stack)
    options: list[Option] = [
        ("cheap", 1, [pod([container(cpu="250m")])]),
        ("dear", 1, [pod([container(cpu="3", memory="4Gi")])]),
    ]
    assert await expander_choice(s, options) == "dear"
    for constant in (0.01, 0.05, 1.0):
        assert await expander_choice(s, options, constant_pod_price=constant) == "cheap"


async def test_pod_price_errors(stack: StackFactory) -> None:
    s = await priced_stack(stack)
    gpu_pod = pod([container(cpu="1", **{"nvidia.com/gpu": "1"})])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingPodPrice(pod_request(gpu_pod, 3600, old=False, new=True))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == (
        "pod default/p: no node group has nodes with all it requests (cpu=1, nvidia.com/gpu=1)"
    )
    # A client-supplied resource name is echoed clipped, not whole.
    huge = pod([container(cpu="1", **{"example.com/" + "x" * 100_000: "1"})])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingPodPrice(pod_request(huge, 3600, old=False, new=True))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = caught.value.details() or ""
    assert len(details) < ECHO_LIMIT + 200 and "characters)" in details
    bad = pod([container(cpu="lots")])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingPodPrice(pod_request(bad, 3600, old=False, new=True))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("pod default/p: ")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingPodPrice(pb.PricingPodPriceRequest())
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- template and check-config show interfaces and prices -----------------------------------


async def test_template_and_check_config_show_interfaces_and_price(
    emulator: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    groups = [
        {
            "name": "private",
            "minSize": 0,
            "maxSize": 3,
            "flavor": "flex-8-4",
            "image": "debian-12",
            "zone": "lpg1",
            "volumeSizeGB": 50,
            "interfaces": [
                {"network": "k8s-nodes", "subnet": "7a1c0000-0000-4000-8000-000000000102"}
            ],
        }
    ]
    pricing = {
        "currency": "CHF",
        "flavorsPerHour": {"flex-8-4": "0.0913"},
        "volumePerGBHour": "0.0006",
    }
    path = write_config(tmp_path, groups, url=emulator.url, token=TOKEN, pricing=pricing)
    argv = ["template", "--config", str(path), "private", "-o", "json"]
    assert await asyncio.to_thread(main, argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["kind"] == "Node"
    assert err.splitlines() == [
        "# node group private: interfaces: k8s-nodes (subnet 7a1c0000-0000-4000-8000-000000000102)",
        "# price: 0.1213 CHF/h (flavor 0.0913 + 50 GB x 0.0006)",
    ]
    assert await asyncio.to_thread(main, ["check-config", "--config", str(path)]) == 0
    summary = capsys.readouterr().out.splitlines()
    assert "pricing:            CHF, 1 flavor price(s), volume 0.0006 per GB and hour" in summary
    assert summary[-1].endswith(
        "interfaces: k8s-nodes (subnet 7a1c0000-0000-4000-8000-000000000102), "
        "price 0.1213 CHF/h (flavor 0.0913 + 50 GB x 0.0006)"
    )


# --- requests CA would never send, answered precisely ----------------------------------------


async def test_newer_fields_win_when_both_differ(stack: StackFactory) -> None:
    # CA 1.34.2+ sends both generations with the same values; were they different, the newer
    # ones (Timestamp, pod_bytes) are the ones read.
    s = await priced_stack(stack)
    node = await template_node(s, "cheap")
    request = node_request(node, 3600, old=False, new=True)
    request.startTime.seconds, request.endTime.seconds = START, START + 7200
    reply = await s.stub.PricingNodePrice(request)
    assert reply.price == float(hourly("flex-16-4", 50))
    small = pod([container(cpu="500m")])
    big = pod([container(cpu="2")])
    request = pod_request(big, 3600, old=False, new=True)
    request.pod.CopyFrom(small)
    request.startTime.seconds, request.endTime.seconds = START, START + 7200
    reply = await s.stub.PricingPodPrice(request)
    assert reply.price == float(hourly("flex-16-4", 50) / 2)


@pytest.mark.parametrize(
    ("the_pod", "message"),
    [
        (
            pod([container(cpu="-4")]),
            'pod default/p: container c: requests.cpu: must not be negative, got "-4"',
        ),
        (
            pod([container(cpu="1")], init=[container(memory="-1Gi")]),
            'pod default/p: init container c: requests.memory: must not be negative, got "-1Gi"',
        ),
        (
            pod([container(cpu="1")], overhead={"cpu": "-100m"}),
            'pod default/p: overhead.cpu: must not be negative, got "-100m"',
        ),
        (
            pod([container(cpu="1")], pod_level={"cpu": "-1"}),
            'pod default/p: resources.requests.cpu: must not be negative, got "-1"',
        ),
        # Valid Kubernetes syntax, but its price is beyond what CA can read.
        (
            pod([container(cpu="1e400")]),
            "pod default/p: the price over 3600 seconds is beyond a double's range",
        ),
    ],
)
async def test_pod_price_refuses_absurd_requests(
    stack: StackFactory, the_pod: core_v1_pb2.Pod, message: str
) -> None:
    s = await priced_stack(stack)
    error = await refusal(s.stub.PricingPodPrice(pod_request(the_pod, 3600, old=False, new=True)))
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


async def test_huge_request_without_a_fitting_group_is_named(stack: StackFactory) -> None:
    s = await priced_stack(stack)
    gpu_pod = pod([container(**{"nvidia.com/gpu": "1e400"})])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await s.stub.PricingPodPrice(pod_request(gpu_pod, 3600, old=False, new=True))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == (
        "pod default/p: no node group has nodes with all it requests "
        "(nvidia.com/gpu=(beyond a double's range))"
    )


@pytest.mark.parametrize(
    ("old", "field", "nanos"),
    [
        (False, "startTimestamp", -1),
        (False, "endTimestamp", 10**9),
        (True, "startTime", -5),
        (True, "endTime", 2 * 10**9),
    ],
)
async def test_out_of_range_nanos_are_invalid(
    stack: StackFactory, old: bool, field: str, nanos: int
) -> None:
    s = await priced_stack(stack)
    node = await template_node(s, "cheap")
    node_req = node_request(node, 3600, old=old, new=not old)
    pod_req = pod_request(pod([container(cpu="1")]), 3600, old=old, new=not old)
    for request, call in ((node_req, s.stub.PricingNodePrice), (pod_req, s.stub.PricingPodPrice)):
        getattr(request, field).nanos = nanos
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == (
            f"{field}.nanos must be between 0 and 999999999, got {nanos}"
        )


async def test_the_longest_interval_is_priced(stack: StackFactory) -> None:
    # The price bound keeps even int64's whole range of seconds a finite double.
    s = await priced_stack(stack)
    node = await template_node(s, "cheap")
    request = pb.PricingNodePriceRequest(node=node)
    request.startTimestamp.seconds, request.endTimestamp.seconds = -(2**63), 2**63 - 1
    reply = await s.stub.PricingNodePrice(request)
    assert reply.price == float(hourly("flex-16-4", 50) * (2**64 - 1) / 3600)
