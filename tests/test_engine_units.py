"""Table tests for the engine's pure parts: names, specs, options, instance states, and the
group bookkeeping that decides target sizes and which nodes DeleteNodes may touch."""

from __future__ import annotations

import re

import pytest
from google.protobuf import duration_pb2

from cloudscale_autoscaler.cloud.errors import (
    CapacityError,
    InvalidRequestError,
    QuotaExceededError,
)
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP, TAG_REQUEST, Server
from cloudscale_autoscaler.engine import instances, names, options, spec
from cloudscale_autoscaler.engine.errors import FailedPrecondition
from cloudscale_autoscaler.engine.group import (
    AlreadyGone,
    DeleteServer,
    GroupState,
    NodeRef,
    RemovePlaceholder,
)
from cloudscale_autoscaler.engine.records import Batch, Creation, CreationState, Placeholder
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos.k8s.apimachinery import meta_v1_pb2
from cloudscale_autoscaler.settings.types import AutoscalingOptions, NodeGroupConfig, Taint

# --- names ---------------------------------------------------------------------------------

HOST_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@pytest.mark.parametrize(
    ("cluster", "group", "expected"),
    [
        ("prod", "workers", "prod-workers-abcd1234"),
        ("a" * 40, "b" * 40, "a" * 40 + "-" + "b" * 13 + "-abcd1234"),
        ("a" * 53, "bbb", "a" * 53 + "-abcd1234"),  # a cut ending in "-" drops the "-"
        ("Prod", "Workers", "prod-workers-abcd1234"),
    ],
)
def test_server_name(cluster: str, group: str, expected: str) -> None:
    name = names.server_name(cluster, group, "abcd1234")
    assert name == expected
    assert HOST_LABEL.match(name)


def test_random_suffix_alphabet() -> None:
    suffixes = {names.random_suffix() for _ in range(50)}
    assert len(suffixes) == 50
    assert all(re.fullmatch(r"[a-z0-9]{8}", s) for s in suffixes)


# --- create spec ---------------------------------------------------------------------------

GROUP = NodeGroupConfig(
    name="workers",
    min_size=0,
    max_size=5,
    flavor="flex-8-4",
    image="debian-12",
    zone="lpg1",
    volume_size_gb=50,
    ssh_keys=("ssh-ed25519 AAAA k",),
    server_groups=("sg-uuid",),
    use_private_network=True,
    user_data="#cloud-config\n# ${server_name} ${group} ${cluster}\n"
    "labels=${node_labels} taints=${node_taints} $${literal}\n",
    tags=(("team", "infra"), (TAG_CLUSTER, "spoofed")),
    labels=(("role", "worker"), ("tier", "a")),
    taints=(Taint("dedicated", "ci", "NoSchedule"), Taint("spot", "", "NoExecute")),
)


def test_build_spec_carries_everything() -> None:
    server = spec.build_spec("prod", GROUP, "prod-workers-x", "req1", dict(GROUP.labels))
    assert (server.name, server.flavor, server.image, server.zone) == (
        "prod-workers-x",
        "flex-8-4",
        "debian-12",
        "lpg1",
    )
    assert server.volume_size_gb == 50
    assert server.ssh_keys == ("ssh-ed25519 AAAA k",)
    assert server.server_groups == ("sg-uuid",)
    assert (server.use_public_network, server.use_private_network, server.use_ipv6) == (
        True,
        True,
        True,
    )
    assert server.tags == {
        "team": "infra",
        TAG_CLUSTER: "prod",
        TAG_GROUP: "workers",
        TAG_REQUEST: "req1",
    }
    assert server.user_data == (
        "#cloud-config\n# prod-workers-x workers prod\n"
        "labels=role=worker,tier=a taints=dedicated=ci:NoSchedule,spot:NoExecute ${literal}\n"
    )


def test_build_spec_without_user_data() -> None:
    plain = NodeGroupConfig(name="g", min_size=0, max_size=1, flavor="f", image="i")
    assert spec.build_spec("c", plain, "c-g-x", "r", {}).user_data is None


# --- autoscaling options -----------------------------------------------------------------------


def _defaults(new: bool, old: bool) -> pb.NodeGroupAutoscalingOptions:
    d = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5,
        scaleDownGpuUtilizationThreshold=0.6,
        zeroOrMaxNodeScaling=True,
        ignoreDaemonSetsUtilization=True,
        allowNonAtomicScaleUpToMax=True,
    )
    if new:
        d.scaleDownUnneededDuration.CopyFrom(duration_pb2.Duration(seconds=600))
        d.scaleDownUnreadyDuration.CopyFrom(duration_pb2.Duration(seconds=1200))
        d.MaxNodeProvisionDuration.CopyFrom(duration_pb2.Duration(seconds=900))
        d.maxNodeStartupDuration.CopyFrom(duration_pb2.Duration(seconds=901, nanos=5))
    if old:
        d.scaleDownUnneededTime.CopyFrom(meta_v1_pb2.Duration(duration=601 * 10**9))
        d.scaleDownUnreadyTime.CopyFrom(meta_v1_pb2.Duration(duration=1201 * 10**9))
        d.MaxNodeProvisionTime.CopyFrom(meta_v1_pb2.Duration(duration=902 * 10**9))
    return d


def _durations(o: pb.NodeGroupAutoscalingOptions) -> tuple[float, ...]:
    def new(d: duration_pb2.Duration) -> float:
        return d.seconds + d.nanos / 1e9

    return (
        new(o.scaleDownUnneededDuration),
        new(o.scaleDownUnreadyDuration),
        new(o.MaxNodeProvisionDuration),
        new(o.maxNodeStartupDuration),
        o.scaleDownUnneededTime.duration / 1e9,
        o.scaleDownUnreadyTime.duration / 1e9,
        o.MaxNodeProvisionTime.duration / 1e9,
    )


@pytest.mark.parametrize(
    ("new", "old", "expected"),
    [
        # The new generation wins when both are sent; old only -> old values; none -> 0.
        (True, True, (600, 1200, 900, 901.000000005, 600, 1200, 900)),
        (True, False, (600, 1200, 900, 901.000000005, 600, 1200, 900)),
        (False, True, (601, 1201, 902, 0, 601, 1201, 902)),
        (False, False, (0, 0, 0, 0, 0, 0, 0)),
    ],
)
def test_options_defaults_fill_both_generations(
    new: bool, old: bool, expected: tuple[float, ...]
) -> None:
    overrides = AutoscalingOptions(scale_down_utilization_threshold=0.3)
    got = options.build_options(overrides, _defaults(new, old)).nodeGroupAutoscalingOptions
    assert _durations(got) == pytest.approx(expected)
    assert got.scaleDownUtilizationThreshold == 0.3
    assert got.scaleDownGpuUtilizationThreshold == pytest.approx(0.6)
    assert got.zeroOrMaxNodeScaling and got.ignoreDaemonSetsUtilization
    assert got.allowNonAtomicScaleUpToMax


def test_options_overrides_win_everywhere() -> None:
    overrides = AutoscalingOptions(
        scale_down_utilization_threshold=0.1,
        scale_down_gpu_utilization_threshold=0.2,
        scale_down_unneeded_seconds=60,
        scale_down_unready_seconds=120.5,
        max_node_provision_seconds=300,
        max_node_startup_seconds=400,
        zero_or_max_node_scaling=False,
        ignore_daemonsets_utilization=False,
        allow_non_atomic_scale_up_to_max=False,
    )
    assert not options.depends_on_defaults(overrides)
    got = options.build_options(overrides, _defaults(True, True)).nodeGroupAutoscalingOptions
    assert _durations(got) == pytest.approx((60, 120.5, 300, 400, 60, 120.5, 300))
    assert got.scaleDownUtilizationThreshold == pytest.approx(0.1)
    assert got.scaleDownGpuUtilizationThreshold == pytest.approx(0.2)
    assert not (
        got.zeroOrMaxNodeScaling
        or got.ignoreDaemonSetsUtilization
        or got.allowNonAtomicScaleUpToMax
    )
    # Every duration field is present on the wire even when zero-valued defaults apply.
    for field in ("scaleDownUnneededTime", "MaxNodeProvisionDuration", "maxNodeStartupDuration"):
        assert got.HasField(field)


# --- instance states -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "deleting", "state", "error_code"),
    [
        ("changing", False, instances.CREATING, ""),
        ("running", False, instances.RUNNING, ""),
        ("stopped", False, instances.RUNNING, ""),
        ("paused", False, instances.RUNNING, ""),
        ("rescue_running", False, instances.RUNNING, ""),
        ("rescue_stopped", False, instances.RUNNING, ""),
        ("error", False, instances.CREATING, instances.SERVER_ERROR_CODE),
        ("unknown", False, instances.UNSPECIFIED, ""),
        ("something-new", False, instances.UNSPECIFIED, ""),
        ("changing", True, instances.DELETING, ""),
        ("running", True, instances.DELETING, ""),
    ],
)
def test_server_instance(status: str, deleting: bool, state: int, error_code: str) -> None:
    server = Server("47cec963-fcd2-482f-bdb6-24461b2d47b1", "n", status)
    got = instances.server_instance(server, deleting, is_booting=True)
    assert got.id == "cloudscale://47cec963-fcd2-482f-bdb6-24461b2d47b1"
    assert got.status.instanceState == state
    assert got.status.errorInfo.errorCode == error_code


@pytest.mark.parametrize(
    ("error", "code", "error_class"),
    [
        (QuotaExceededError("Quota exceeded: servers", 400), "QUOTA_EXCEEDED", 1),
        (CapacityError("Insufficient capacity in zone rma1", 400), "ZONE_CAPACITY_EXHAUSTED", 1),
        (InvalidRequestError("flavor: Invalid", 400), "INVALID_REQUEST", 99),
    ],
)
def test_placeholder_instance(error: Exception, code: str, error_class: int) -> None:
    assert isinstance(error, QuotaExceededError | CapacityError | InvalidRequestError)
    placeholder = Placeholder.from_error("abc", "abc", error, 0.0)
    got = instances.placeholder_instance(placeholder)
    assert got.id == "cloudscale://failed-abc"
    assert got.status.instanceState == instances.CREATING
    info = got.status.errorInfo
    assert (info.errorCode, info.errorMessage, info.instanceErrorClass) == (
        code,
        error.message,
        error_class,
    )


# --- group bookkeeping -------------------------------------------------------------------------


def uuid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def server(n: int, status: str = "running", request: str | None = None) -> Server:
    tags = {TAG_CLUSTER: "c", TAG_GROUP: "g"}
    if request:
        tags[TAG_REQUEST] = request
    return Server(uuid(n), f"c-g-{n}", status, tags=tags)


def listing(*servers: Server) -> dict[str, Server]:
    return {s.uuid: s for s in servers}


def make_group(min_size: int = 0) -> GroupState:
    return GroupState(NodeGroupConfig("g", min_size, 10, "flex-4-2", "debian-12"))


def creation(group: GroupState, request: str, uuid_: str | None = None, tick: int = 0) -> Creation:
    c = Creation(request, f"c-g-{request}", Batch(1))
    if uuid_ is not None:
        c.uuid, c.acked_tick, c.state = uuid_, tick, CreationState.ACKED
    group.creations[request] = c
    return c


def test_target_counts_servers_creations_placeholders() -> None:
    group = make_group()
    group.apply_listing(listing(server(1), server(2)), start_tick=1)
    creation(group, "r1")
    creation(group, "r2", uuid(9), tick=2)
    group.add_placeholder(Placeholder("p1", "p1", "QUOTA_EXCEEDED", "q", 1, 0.0))
    assert group.target() == 5


@pytest.mark.parametrize(
    ("acked_tick", "start_tick", "listed", "kept"),
    [
        (5, 3, False, True),  # acked after the listing began: it may simply not show yet
        (2, 3, False, False),  # acked before, not listed: deleted behind our back
        (2, 3, True, False),  # listed: now counted as a server
        (5, 3, True, False),
    ],
)
def test_acked_creation_reconciled_by_uuid(
    acked_tick: int, start_tick: int, listed: bool, kept: bool
) -> None:
    group = make_group()
    creation(group, "r1", uuid(7), tick=acked_tick)
    servers = listing(server(7)) if listed else listing()
    group.apply_listing(servers, start_tick)
    assert ("r1" in group.creations) == kept
    # Never double counted, never lost unless proven gone.
    assert group.target() == (1 if listed or kept else 0)


def test_unacked_creation_matched_by_request_tag() -> None:
    group = make_group()
    creation(group, "r1")
    group.apply_listing(listing(server(3, "changing", request="r1")), start_tick=1)
    assert group.creations == {}
    assert group.target() == 1


def test_failed_creation_that_exists_replaces_its_placeholder() -> None:
    group = make_group()
    group.add_placeholder(Placeholder("r1", "r1", "CLOUD_UNAVAILABLE", "lost", 99, 0.0))
    group.apply_listing(listing(server(3, request="r1")), start_tick=1)
    assert group.placeholders == {}
    assert group.target() == 1
    assert isinstance(group.resolve(NodeRef("cloudscale://failed-r1"), lambda _: None), AlreadyGone)


@pytest.mark.parametrize(
    ("deleted_tick", "start_tick", "listed", "target", "remembered"),
    [
        (5, 3, True, 0, True),  # older listing still shows it: stays excluded
        (5, 3, False, 0, True),
        (2, 3, True, 0, True),  # slow delete: listed after our 204, still excluded
        (2, 3, False, 0, False),  # gone: forgotten
    ],
)
def test_deleted_servers_stay_excluded_until_gone(
    deleted_tick: int, start_tick: int, listed: bool, target: int, remembered: bool
) -> None:
    group = make_group()
    group.apply_listing(listing(server(1)), start_tick=1)
    group.deleted[uuid(1)] = deleted_tick
    group.apply_listing(listing(server(1, "changing")) if listed else listing(), start_tick)
    assert group.target() == target
    assert (uuid(1) in group.deleted) == remembered


def test_placeholders_expire() -> None:
    group = make_group()
    group.add_placeholder(Placeholder("old", "old", "X", "m", 99, 0.0))
    group.add_placeholder(Placeholder("new", "new", "X", "m", 99, 50.0))
    assert group.expire_placeholders(now=60.0, lifetime=30.0) == 1
    assert list(group.placeholders) == ["new"]
    assert "old" in group.gone


def _owner(u: str) -> str | None:
    return "other" if u == uuid(50) else None


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (NodeRef(f"cloudscale://{uuid(1)}", "n1"), DeleteServer),
        (NodeRef(f"CLOUDSCALE://{uuid(1).upper()}", "n1"), DeleteServer),
        (NodeRef(f"cloudscale://{uuid(1).replace('-', '')}"), DeleteServer),
        (NodeRef("", "c-g-1"), DeleteServer),  # no providerID: exact name of this group
        (NodeRef("cloudscale://failed-p1", "cloudscale://failed-p1"), RemovePlaceholder),
        (NodeRef("cloudscale://failed-gone1"), AlreadyGone),
        (NodeRef(f"cloudscale://{uuid(2)}"), AlreadyGone),  # ours, vanished
        (NodeRef(f"cloudscale://{uuid(50)}", "x"), "node group other"),
        (NodeRef(f"cloudscale://{uuid(99)}", "x"), "no server with that uuid"),
        (NodeRef("cloudscale://failed-nope"), "no failed-creation placeholder"),
        (NodeRef(f"aws://{uuid(1)}", "x"), "not a cloudscale server"),
        (NodeRef("", "c-g-77"), "no server of node group g has that name"),
        (NodeRef("", ""), "no server"),
    ],
)
def test_resolve(node: NodeRef, expected: type | str) -> None:
    group = make_group()
    group.apply_listing(listing(server(1), server(2)), start_tick=1)
    group.apply_listing(listing(server(1)), start_tick=2)  # server 2 vanished
    group.add_placeholder(Placeholder("p1", "p1", "X", "m", 99, 0.0))
    group.add_placeholder(Placeholder("gone1", "gone1", "X", "m", 99, 0.0))
    group.remove_placeholder("gone1")
    if isinstance(expected, str):
        with pytest.raises(FailedPrecondition, match=expected):
            group.resolve(node, _owner)
    else:
        assert isinstance(group.resolve(node, _owner), expected)


def test_resolve_refuses_ambiguous_name() -> None:
    group = make_group()
    twin = Server(uuid(2), "c-g-1", "running", tags={TAG_CLUSTER: "c", TAG_GROUP: "g"})
    group.apply_listing(listing(server(1), twin), start_tick=1)
    with pytest.raises(FailedPrecondition, match="several servers"):
        group.resolve(NodeRef("", "c-g-1"), _owner)


def test_error_server_is_exempt_from_min_size() -> None:
    group = make_group()
    group.apply_listing(listing(server(1, "error")), start_tick=1)
    resolved = group.resolve(NodeRef(f"cloudscale://{uuid(1)}"), _owner)
    assert isinstance(resolved, DeleteServer) and resolved.broken


def test_instances_lists_servers_acked_and_placeholders_not_unsent() -> None:
    group = make_group()
    group.apply_listing(listing(server(1), server(2, "changing")), start_tick=1)
    group.deleted[uuid(1)] = 5
    creation(group, "unsent")
    creation(group, "acked", uuid(8), tick=3)
    group.add_placeholder(Placeholder("p1", "p1", "QUOTA_EXCEEDED", "m", 1, 0.0))
    got = {i.id: i.status.instanceState for i in group.instances(0.0)}
    assert got == {
        f"cloudscale://{uuid(1)}": instances.DELETING,
        f"cloudscale://{uuid(2)}": instances.CREATING,
        f"cloudscale://{uuid(8)}": instances.CREATING,
        "cloudscale://failed-p1": instances.CREATING,
    }


def test_batch_verdict() -> None:
    batch = Batch(3)
    batch.failures = 2
    batch.record()
    assert not batch.settled.is_set()
    batch.failures = 3
    batch.record()
    assert batch.settled.is_set() and batch.all_failed
    mixed = Batch(3)
    mixed.failures, mixed.successes = 1, 1
    mixed.record()
    assert mixed.settled.is_set() and not mixed.all_failed
