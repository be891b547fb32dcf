"""The status view: GET /status on the metrics endpoint and the `status` command.

- Table tests of the pure parts: a group's snapshot (servers by the state CA sees, creations
  sent and queued, placeholders with the cloud's refusal, class, age and expiry), the leader
  section, the JSON document, and the table a person reads from it.
- End to end: a real `serve` (mTLS gRPC, metrics endpoint) against the emulator refusing
  creates for quota; IncreaseSize over real gRPC; GET /status shows the placeholder with the
  cloud's text, its class and age; `cloudscale-autoscaler status` prints the group and the
  refusal, `--output json` the same document, and an unreachable or wrong URL is one line
  and exit code 1.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from campaign.serve import ServeProcess, start_serve, write_config
from cryptography import x509
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.stack import StackFactory
from fixtures.tls import PKI, grpc_channel
from fixtures.tools import cli, free_port

from cloudscale_autoscaler.cloud.errors import CapacityError, InvalidRequestError
from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_DELETION, TAG_GROUP, Server
from cloudscale_autoscaler.commands import status as command
from cloudscale_autoscaler.engine.group import GroupState
from cloudscale_autoscaler.engine.records import Batch, Creation, CreationState, Placeholder
from cloudscale_autoscaler.engine.status import RefreshOutcome, group_status, server_counts
from cloudscale_autoscaler.observability.metrics import RpcReading
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.service.seen import CallsSeen
from cloudscale_autoscaler.service.serving import Serving
from cloudscale_autoscaler.settings.types import MetricsConfig, NodeGroupConfig
from cloudscale_autoscaler.status import LeaderStatus, collect, leader_status

NOW_UNIX = 1_800_000_000.0
LIFETIME = 900.0


def iso(seconds_ago: float) -> str:
    return (datetime.fromtimestamp(NOW_UNIX, UTC) - timedelta(seconds=seconds_ago)).isoformat()


def server(n: int, status: str = "running", age: float = 60.0, **tags: str) -> Server:
    labels = {TAG_CLUSTER: "c", TAG_GROUP: "g", **tags}
    return Server(f"00000000-0000-0000-0000-{n:012d}", f"c-g-{n}", status, created_at=iso(age),
                  tags=labels)  # fmt: skip


def make_group(*servers: Server) -> GroupState:
    group = GroupState(NodeGroupConfig("g", 1, 10, "flex-4-2", "debian-12"))
    group.servers = {s.uuid: s for s in servers}
    return group


# --- servers by the state CA sees -------------------------------------------------------------


@pytest.mark.parametrize(
    ("listed", "counted"),
    [
        (server(1, "running"), "running"),
        (server(1, "stopped"), "running"),
        (server(1, "changing", age=30), "creating"),  # booting
        (server(1, "changing", age=3600), "running"),  # long past its boot: resized, rebooted
        (server(1, "error"), "error"),
        (server(1, "unknown"), "other"),
        (server(1, "running", **{TAG_DELETION: "2026-01-01T00:00:00Z"}), "deleting"),
        (server(1, "error", **{TAG_DELETION: "2026-01-01T00:00:00Z"}), "deleting"),
    ],
)
def test_servers_are_counted_by_the_state_ca_sees(listed: Server, counted: str) -> None:
    counts = server_counts(make_group(listed), NOW_UNIX)
    others = {name: n for name, n in vars(counts).items() if name != counted}
    assert getattr(counts, counted) == 1
    assert set(others.values()) == {0}


async def test_a_server_whose_delete_runs_counts_as_deleting() -> None:
    group = make_group(server(1), server(2))
    # A future of the running loop: a bare asyncio.Future() needs a current loop, which an
    # earlier test's asyncio.run may have left unset.
    running = asyncio.get_running_loop().create_future()
    group.deleting[server(1).uuid] = running  # type: ignore[assignment]
    counts = server_counts(group, NOW_UNIX)
    assert (counts.running, counts.deleting) == (1, 1)


# --- one group's snapshot ---------------------------------------------------------------------


def placeholder(ident: str, error: Exception, created: float) -> Placeholder:
    assert isinstance(error, CapacityError | InvalidRequestError)
    return Placeholder.from_error(ident, ident, error, created)


def test_group_snapshot_counts_creations_placeholders_and_deletions() -> None:
    tagged = server(3, **{TAG_DELETION: "2026-01-01T00:00:00Z"})
    group = make_group(server(1), server(2, "changing", age=5), tagged)
    batch = Batch(4)
    for rid, state, uuid in [
        ("r-queued", CreationState.QUEUED, None),
        ("r-sending", CreationState.SENDING, None),
        ("r-acked", CreationState.ACKED, "11111111-0000-0000-0000-000000000000"),
        ("r-listed", CreationState.ACKED, server(2).uuid),  # listed: a server, not a creation
    ]:
        group.creations[rid] = Creation(rid, rid, batch, state, uuid)
    capacity = CapacityError("Insufficient capacity in zone lpg1 for flex-4-2.", 400)
    invalid = InvalidRequestError("image: not found", 400)
    group.add_placeholder(placeholder("p-old", capacity, created=100.0))
    group.add_placeholder(placeholder("p-new", invalid, created=1000.0))

    got = group_status(group, now=1090.0, now_unix=NOW_UNIX, lifetime=LIFETIME)

    assert (got.name, got.min_size, got.max_size) == ("g", 1, 10)
    assert got.target_size == group.target() == 2 + 3 + 2  # listed - tagged + pending + failed
    assert (got.servers.running, got.servers.creating, got.servers.deleting) == (1, 1, 1)
    assert (got.creations_in_flight, got.creations_queued) == (2, 1)
    assert (got.deletions_in_flight, got.deletions_pending) == (0, 1)
    old, new = got.placeholders
    assert old.provider_id == "cloudscale://failed-p-old"
    assert (old.error_code, old.error_class) == ("ZONE_CAPACITY_EXHAUSTED", "OutOfResources")
    assert old.error == "Insufficient capacity in zone lpg1 for flex-4-2."
    assert (old.age_seconds, old.expires_in_seconds) == (990.0, 0.0)  # past expiry, not gone
    assert (new.error_code, new.error_class) == ("INVALID_REQUEST", "Other")
    assert (new.age_seconds, new.expires_in_seconds) == (90.0, LIFETIME - 90.0)
    # Reading expires nothing: the placeholder past its lifetime is still there.
    assert len(group.placeholders) == 2


# --- leader ---------------------------------------------------------------------------------


def test_leader_section() -> None:
    assert leader_status(Serving(), None) is None  # no leader election
    serving = Serving("ns/lease")
    assert leader_status(serving, "me") == LeaderStatus("ns/lease", "me", False, None)
    serving.stand_by("pod-b")
    assert leader_status(serving, "me") == LeaderStatus("ns/lease", "me", False, "pod-b")
    serving.serve_until(time.monotonic() + 60)
    assert leader_status(serving, "me") == LeaderStatus("ns/lease", "me", True, "me")


# --- calls seen ------------------------------------------------------------------------------


def test_calls_seen_counts_per_configured_group_only() -> None:
    seen = CallsSeen(["a", "b"])
    before = time.time()
    seen.record("a", "NodeGroupIncreaseSize")
    seen.record("a", "NodeGroupIncreaseSize")
    seen.record("a", "NodeGroupDeleteNodes")
    seen.record("nope", "NodeGroupIncreaseSize")  # a caller cannot grow the table
    assert {rpc: s.count for rpc, s in seen.of("a").items()} == {
        "NodeGroupIncreaseSize": 2,
        "NodeGroupDeleteNodes": 1,
    }
    assert before <= seen.of("a")["NodeGroupIncreaseSize"].last_unix <= time.time()
    assert seen.of("b") == {}
    assert seen.of("nope") == {}


# --- the JSON document and the table ------------------------------------------------------


def document(
    *,
    refresh: RefreshOutcome | None = None,
    leader: LeaderStatus | None = None,
    tls: float | None = None,
) -> dict[str, Any]:
    """A snapshot of one group with a placeholder and a DeleteNodes seen, as served."""
    group = make_group(server(1), server(2))
    quota = CapacityError("Quota exceeded: servers (limit 2, in use 2).", 400)
    group.add_placeholder(placeholder("abc", quota, created=40.0))
    seen = CallsSeen(["g"])
    seen.record("g", "NodeGroupDeleteNodes")
    seen.record("g", "NodeGroupDeleteNodes")
    seen.record("unknown", "NodeGroupIncreaseSize")  # not a configured group: not kept
    status = collect(
        [group_status(group, now=100.0, now_unix=time.time(), lifetime=LIFETIME)],
        seen,
        refresh,
        0.0 if refresh is None or refresh.error else refresh.at_unix,
        leader,
        tls,
        [RpcReading("Refresh", {"OK": 3}, [], 0.1), RpcReading("Cleanup", {}, [], 0.0)],
    )
    answer: dict[str, Any] = json.loads(json.dumps(status.to_json()))  # as the wire has it
    return answer


def test_json_document_carries_every_section() -> None:
    now = time.time()
    doc = document(refresh=RefreshOutcome(now - 5, 0.25), tls=now + 86400)
    (group,) = doc["groups"]
    assert group["placeholders"] == [
        {
            "provider_id": "cloudscale://failed-abc",
            "error_code": "ZONE_CAPACITY_EXHAUSTED",
            "error": "Quota exceeded: servers (limit 2, in use 2).",
            "error_class": "OutOfResources",
            "age_seconds": 60.0,
            "expires_in_seconds": LIFETIME - 60.0,
        }
    ]
    assert group["calls"]["NodeGroupDeleteNodes"]["count"] == 2
    assert abs(group["calls"]["NodeGroupDeleteNodes"]["last_unix"] - now) < 60
    assert list(group["calls"]) == ["NodeGroupDeleteNodes"]
    assert doc["refresh"] == {"at_unix": now - 5, "seconds": 0.25, "error": None, "ok": True}
    assert doc["last_successful_refresh_unix"] == now - 5
    assert doc["leader"] is None
    assert doc["tls_not_after_unix"] == now + 86400
    assert doc["rpcs"] == {"Refresh": {"OK": 3}}  # methods never called are left out


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (3599, "59m59s"), (3600, "1h00m"),
     (86399, "23h59m"), (90061, "1d01h"), (-5, "0s")],
)  # fmt: skip
def test_duration(seconds: float, shown: str) -> None:
    assert command.duration(seconds) == shown


def cells(line: str) -> list[str]:
    """A table line's cells (columns are at least two spaces apart)."""
    return re.split(r"\s{2,}", line.strip())


def test_table_rows_per_group_then_placeholders_then_lines() -> None:
    now = time.time()
    doc = document(refresh=RefreshOutcome(now - 5, 0.25), tls=now + 3 * 86400 + 60)
    doc["at_unix"] = now
    lines = command.render_table(doc).splitlines()
    assert cells(lines[0]) == list(command.GROUP_HEADER)
    assert cells(lines[1]) == ["g", "1", "10", "3", "2", "0", "0", "0", "0", "0", "1", "0", "-",
                               "0s ago (2x)"]  # fmt: skip
    assert lines[2] == ""
    assert cells(lines[3]) == list(command.PLACEHOLDER_HEADER)
    assert cells(lines[4]) == ["g", "cloudscale://failed-abc", "OutOfResources",
                               "ZONE_CAPACITY_EXHAUSTED", "1m00s", "14m00s",
                               "Quota exceeded: servers (limit 2, in use 2)."]  # fmt: skip
    assert lines[5] == ""
    assert lines[6:] == [
        "refresh: ok 5s ago, took 0.25s",
        "leader:  no leader election (this replica serves)",
        "tls:     certificate expires "
        + datetime.fromtimestamp(now + 3 * 86400 + 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        + " (in 3d00h)",
    ]


@pytest.mark.parametrize(
    ("refresh", "leader", "tls", "expected"),
    [
        (None, None, None, ["refresh: none yet", "leader:  no leader election (this replica "
                            "serves)", "tls:     off (plaintext gRPC)"]),
        (
            RefreshOutcome(-130, 5.0, "Refresh: the cloudscale.ch API is unreachable: boom"),
            LeaderStatus("ns/l", "pod-a", True, "pod-a"),
            -3600,
            ["refresh: FAILED 2m10s ago, took 5.00s (last success: never): Refresh: the "
             "cloudscale.ch API is unreachable: boom",
             "leader:  this replica (pod-a) leads (Lease ns/l)",
             "tls:     certificate expires {stamp} (EXPIRED 1h00m ago)"],
        ),
        (
            None,
            LeaderStatus("ns/l", "pod-b", False, "pod-a"),
            None,
            ["refresh: none yet", "leader:  this replica (pod-b) is a standby; Lease ns/l held "
             "by pod-a", "tls:     off (plaintext gRPC)"],
        ),
        (
            None,
            LeaderStatus("ns/l", "pod-b", False, None),
            None,
            ["refresh: none yet", "leader:  this replica (pod-b) is a standby; Lease ns/l held "
             "by unknown", "tls:     off (plaintext gRPC)"],
        ),
    ],
)  # fmt: skip
def test_table_closing_lines(
    refresh: RefreshOutcome | None,
    leader: LeaderStatus | None,
    tls: float | None,
    expected: list[str],
) -> None:
    """Times in the cases are relative to the snapshot (`at_unix`), as the table shows them."""
    now = time.time()
    if refresh is not None:
        refresh = RefreshOutcome(now + refresh.at_unix, refresh.seconds, refresh.error)
    doc = document(refresh=refresh, leader=leader, tls=None if tls is None else now + tls)
    doc["at_unix"] = now
    if tls is not None:
        stamp = datetime.fromtimestamp(now + tls, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        expected = [line.format(stamp=stamp) for line in expected]
    assert command.render_table(doc).splitlines()[-3:] == expected


def test_table_says_when_the_last_refresh_succeeded_after_a_failure() -> None:
    now = time.time()
    doc = document(refresh=RefreshOutcome(now - 2, 1.5, "Refresh: the API refused the listing"))
    doc["at_unix"], doc["last_successful_refresh_unix"] = now, now - 600
    assert command.render_table(doc).splitlines()[-3] == (
        "refresh: FAILED 2s ago, took 1.50s (last success: 10m00s ago): Refresh: the API "
        "refused the listing"
    )


@pytest.mark.parametrize(
    ("minimum", "target", "flagged"), [(1, 3, False), (3, 3, False), (4, 3, True)]
)
def test_a_group_below_its_min_size_is_flagged(minimum: int, target: int, flagged: bool) -> None:
    """CA does not scale a group up to minSize by itself: the table says which ones lag."""
    now = time.time()
    doc = document(refresh=RefreshOutcome(now - 5, 0.25))
    doc["at_unix"] = now
    doc["groups"][0].update(min_size=minimum, target_size=target)
    # What the engine says (group_status), as /status serves it.
    group = make_group(*(server(i) for i in range(target)))
    group.config = replace(group.config, min_size=minimum)
    computed = group_status(group, now=100.0, now_unix=now, lifetime=LIFETIME)
    assert computed.below_min_size is flagged
    doc["groups"][0]["below_min_size"] = computed.below_min_size
    lines = command.render_table(doc).splitlines()
    target_cell = cells(lines[1])[command.GROUP_HEADER.index("TARGET")]
    assert target_cell == (f"{target} (<MIN)" if flagged else str(target))
    below = [line for line in lines if line.startswith("below minSize:")]
    assert below == (
        [
            f"below minSize: g has a target of {target}, minSize is {minimum}: CA adds nodes "
            "to it only for pods that need them, or with --enforce-node-group-min-size"
        ]
        if flagged
        else []
    )


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda d: d.pop("refresh"), "no field 'refresh'"),
        (lambda d: d["groups"][0]["servers"].pop("running"), "no field 'running'"),
        (lambda d: d.update(at_unix="soon"), "unexpected type"),
        (lambda d: d["groups"][0].update(placeholders=3), "unexpected type"),
    ],
)
def test_a_document_of_another_shape_is_a_bad_answer(damage: Any, named: str) -> None:
    doc = document()
    damage(doc)
    with pytest.raises(command.BadAnswer, match=named):
        command.render_table(doc)


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("http://10.0.0.5:8080", "http://10.0.0.5:8080/status"),
        ("http://10.0.0.5:8080/", "http://10.0.0.5:8080/status"),
        ("http://h:8080/status", "http://h:8080/status"),
        ("http://h:8080/prefix/status", "http://h:8080/prefix/status"),
        # The bare address the option's help offers (HOST:PORT, as metrics.listen has it).
        ("localhost:8080", "http://localhost:8080/status"),
        ("10.0.0.5:8080/status", "http://10.0.0.5:8080/status"),
        ("[::1]:8080", "http://[::1]:8080/status"),
    ],
)
def test_status_url(given: str, used: str) -> None:
    assert command.status_url(given) == used


@pytest.mark.parametrize("given", ["ftp://h/status", "http:///status", "", "://h:1"])
def test_status_url_refuses_what_is_no_http_url(given: str) -> None:
    with pytest.raises(ValueError, match="not an http:// or https:// URL with a host"):
        command.status_url(given)


# --- end to end: a real serve refused by the cloud's quota ---------------------------------


async def run_cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *cli(*args), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
async def refused(tmp_path: Path, pki: PKI, emulator: RunningEmulator) -> Any:
    """A real serve whose IncreaseSize the emulator refused for quota; the time of the call."""
    await emulator.admin.set_faults({"quota": {"max_servers": 0}})
    metrics = f"127.0.0.1:{free_port()}"
    config = write_config(tmp_path / "serve", pki, emulator.url, TOKEN, metrics={"listen": metrics})
    serve = await start_serve(config, log_level="info", metrics=True)
    try:
        async with grpc_channel(pki, serve.address) as channel:
            stub = pb_grpc.CloudProviderStub(channel)  # type: ignore[no-untyped-call]
            await stub.Refresh(pb.RefreshRequest(), timeout=10)
            called = time.time()
            await stub.NodeGroupIncreaseSize(
                pb.NodeGroupIncreaseSizeRequest(id="workers", delta=1), timeout=10
            )
            # The refusal may come after IncreaseSize's wait: CA sees it on its next look.
            for _ in range(200):
                reply = await stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="workers"))
                if any(i.status.errorInfo.errorCode for i in reply.instances):
                    break
                await asyncio.sleep(0.05)
        yield serve, called
    finally:
        await serve.stop()


QUOTA_TEXT = "Quota exceeded: servers (limit 0, in use 0)."


async def test_get_status_shows_the_refused_creation(
    refused: tuple[ServeProcess, float], pki: PKI
) -> None:
    serve, called = refused
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{serve.metrics_port}/status")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/json")
    doc = answer.json()
    (group,) = doc["groups"]
    assert (group["name"], group["min_size"], group["max_size"]) == ("workers", 0, 3)
    assert group["target_size"] == 1  # the placeholder counts
    (failed,) = group["placeholders"]
    assert failed["provider_id"].startswith("cloudscale://failed-")
    assert (failed["error_code"], failed["error_class"]) == ("QUOTA_EXCEEDED", "OutOfResources")
    assert failed["error"] == QUOTA_TEXT
    assert 0 <= failed["age_seconds"] <= time.time() - called
    assert failed["expires_in_seconds"] == pytest.approx(900 - failed["age_seconds"], abs=0.01)
    increase = group["calls"]["NodeGroupIncreaseSize"]
    assert increase["count"] == 1 and called - 1 <= increase["last_unix"] <= time.time()
    assert doc["refresh"]["ok"] is True and doc["refresh"]["at_unix"] <= called
    assert doc["leader"] is None
    served = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    assert doc["tls_not_after_unix"] == served.not_valid_after_utc.timestamp()
    assert doc["rpcs"]["NodeGroupIncreaseSize"] == {"OK": 1}
    assert TOKEN not in answer.text


async def test_status_command_prints_the_group_and_the_refusal(
    refused: tuple[ServeProcess, float],
) -> None:
    serve, _ = refused
    code, out, err = await run_cli("status", "--url", f"http://127.0.0.1:{serve.metrics_port}")
    assert (code, err) == (0, "")
    header, row = (cells(line) for line in out.splitlines()[:2])
    assert header[0] == "GROUP" and row[:4] == ["workers", "0", "3", "1"]
    (placeholder_line,) = [line for line in out.splitlines() if "QUOTA_EXCEEDED" in line]
    assert placeholder_line.startswith("workers")
    assert "OutOfResources" in placeholder_line and placeholder_line.endswith(QUOTA_TEXT)
    assert "refresh: ok" in out and "tls:     certificate expires" in out


async def test_status_command_takes_the_bare_address_its_help_offers(
    refused: tuple[ServeProcess, float],
) -> None:
    serve, _ = refused
    code, out, err = await run_cli("status", "--url", f"127.0.0.1:{serve.metrics_port}")
    assert (code, err) == (0, "")
    assert cells(out.splitlines()[1])[0] == "workers"


async def test_status_command_json_is_the_served_document(
    refused: tuple[ServeProcess, float],
) -> None:
    serve, _ = refused
    url = f"http://127.0.0.1:{serve.metrics_port}/status"
    code, out, err = await run_cli("status", "--url", url, "--output", "json")
    assert (code, err) == (0, "")
    printed = json.loads(out)
    async with httpx.AsyncClient() as http:
        served = (await http.get(url)).json()
    # Two snapshots: only what time moves differs.
    for doc in (printed, served):
        doc.pop("at_unix")
        for placeholder_ in doc["groups"][0]["placeholders"]:
            placeholder_.pop("age_seconds")
            placeholder_.pop("expires_in_seconds")
    assert printed == served
    assert printed["groups"][0]["placeholders"][0]["error"] == QUOTA_TEXT


async def test_status_command_against_something_else_fails_in_one_line(
    refused: tuple[ServeProcess, float],
) -> None:
    serve, _ = refused
    metrics = f"http://127.0.0.1:{serve.metrics_port}/metrics"
    code, out, err = await run_cli("status", "--url", metrics)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"error: {metrics} answered, but not with a cloudscale-autoscaler status: the body is "
        "not JSON (Expecting value: line 1 column 1 (char 0))"
    ]


async def test_status_command_unreachable_url_fails_in_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}/status"  # nothing listens there
    code, out, err = await run_cli("status", "--url", url)
    assert (code, out) == (1, "")
    (line,) = err.splitlines()
    assert line.startswith(f"error: cannot read {url}: ")
    assert "Traceback" not in err


async def test_status_command_invalid_url_fails_in_one_line() -> None:
    code, out, err = await run_cli("status", "--url", "http://[not-an-address/status")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "error: --url 'http://[not-an-address/status': Invalid IPv6 URL; expected "
        "http://HOST:PORT/status, or HOST:PORT"
    ]


async def test_a_failed_refresh_is_shown_with_the_message_ca_got(stack: StackFactory) -> None:
    s = await stack(metrics=MetricsConfig(listen="127.0.0.1:0"))
    assert s.running.health is not None
    url = f"http://127.0.0.1:{s.running.health.port}/status"
    async with httpx.AsyncClient() as http:
        loaded = (await http.get(url)).json()  # the load at start is the first refresh
        assert loaded["refresh"]["ok"] is True
        await s.admin.set_faults({"error_rate": {"list_servers": {"rate": 1.0, "status": 401}}})
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await s.refresh()
        doc = (await http.get(url)).json()
    refresh = doc["refresh"]
    assert (refresh["ok"], refresh["error"]) == (False, refused.value.details())
    assert "the cloudscale.ch API rejected the token" in refresh["error"]
    assert refresh["at_unix"] > loaded["refresh"]["at_unix"]
    assert doc["last_successful_refresh_unix"] == loaded["last_successful_refresh_unix"]
    assert doc["rpcs"]["Refresh"] == {"UNAVAILABLE": 1}
