"""Where reload, leadership, crashes and cloud faults meet: the real provider (in process, over
mTLS gRPC) and the emulator, one seam per test (issue 36's points 1, 2, 3, 7 and 8).

A reload is applied as `serve` applies one (`Running.reconfigure`, after the reloader's own
checks, which tests/test_reload.py runs on files); a restart is a new provider process-equivalent
on the same creation journal (the default place, tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.stack import Stack, StackFactory, group, wait_until
from fixtures.tls import PKI, grpc_channel

from cloudscale_autoscaler.cloud.models import TAG_MANAGED
from cloudscale_autoscaler.journal.entries import decode
from cloudscale_autoscaler.journal.file import FILE_NAME, default_directory
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.settings.types import NetworkInterface, NodeGroupConfig

NODES_LPG = "7a1c0000-0000-4000-8000-000000000001"
FAILED = "cloudscale://failed-"


def reload_to(s: Stack, *groups: NodeGroupConfig, **fields: Any) -> dict[str, Any]:
    """Serve `groups` from now on, as a reload of the config file does."""
    config = dataclasses.replace(s.config, node_groups=tuple(groups), **fields)
    return s.running.reconfigure(config)


async def increase(s: Stack, name: str, delta: int) -> None:
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=name, delta=delta))


async def posts(s: Stack) -> int:
    """Create requests the API received, whatever it answered."""
    return sum((await s.admin.stats()).get("create_server", {}).values())


async def until(condition: Any, what: str, limit: float = 30.0) -> None:
    await wait_until(condition, limit, what)


async def managed(s: Stack) -> list[int]:
    """Members of each server group the provider manages (the emulator has others)."""
    return sorted(
        len(g["servers"])
        for g in await s.admin.server_groups()
        if (g.get("tags") or {}).get(TAG_MANAGED) == "true"
    )


def journal_requests() -> set[str]:
    """The request ids the creation journal (the default place) holds now."""
    directory, _ = default_directory(os.environ)
    path = directory / FILE_NAME
    if not path.exists():
        return set()
    return {entry.request for entry in decode(path.read_text(), "test").entries}


# --- 1: a reload that removes a group ---------------------------------------------------------


async def test_a_removed_group_sends_none_of_its_queued_creates_and_reports_the_rest(
    stack: StackFactory,
) -> None:
    """Three creates, one slot: one is out when a reload removes the group. The two queued are
    never sent; the one out is tracked (journal, report) until its server is listed, then the
    server is reported, kept."""
    s = await stack([group("workers", 0, 5)], cloudscale={"max_concurrent_creates": 1})
    await s.refresh()
    await s.admin.set_faults({"latency": {"create_server": {"fixed_ms": 1500}}})
    await increase(s, "workers", 3)

    async def one_out() -> bool:
        return (await s.admin.in_flight()).get("create_server", 0) == 1

    await until(one_out, "the first create was never sent")
    removed = reload_to(s, group("other", 0, 2))
    assert {n: dataclasses.asdict(r) for n, r in removed.items()} == {
        "workers": {"servers": 0, "creations_in_flight": 1, "server_groups": 0}
    }

    async def only_the_one_sent_recorded() -> bool:  # the cancelled ones leave the journal
        return len(journal_requests()) == 1

    await until(only_the_one_sent_recorded, "the journal never dropped the cancelled creates")
    await asyncio.sleep(2.0)  # the one out completes; the queued ones would have gone out
    assert await posts(s) == 1
    await s.refresh()
    left = s.provider.service.engine.removed_groups()
    assert {n: dataclasses.asdict(r) for n, r in left.items()} == {
        "workers": {"servers": 1, "creations_in_flight": 0, "server_groups": 0}
    }
    assert len(await s.cloud_servers("workers")) == 1
    assert journal_requests() == set()


async def test_an_increase_size_straddling_a_reload_that_removes_its_group_sends_nothing(
    stack: StackFactory,
) -> None:
    """IncreaseSize awaits the network lookup; a reload removes the group meanwhile. It answers
    NOT_FOUND and sends nothing (it held the removed group and created into it)."""
    private = (NetworkInterface("k8s-nodes"),)
    s = await stack([group("workers", 0, 5, interfaces=private)])
    await s.refresh()
    await s.admin.set_faults({"latency": {"list_networks": {"fixed_ms": 1000}}})
    call = asyncio.ensure_future(increase(s, "workers", 2))
    await asyncio.sleep(0.3)  # inside the lookup
    reload_to(s, group("other", 0, 2))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value.details()
    await s.admin.clear_faults()
    await asyncio.sleep(0.5)
    assert await posts(s) == 0
    assert journal_requests() == set()


# --- 2: a reload that changes a group's networks ----------------------------------------------


async def test_a_reload_that_changes_the_interfaces_creates_on_the_new_networks(
    stack: StackFactory,
) -> None:
    workers = group("workers", 0, 5, interfaces=(NetworkInterface("k8s-nodes"),))
    s = await stack([workers])
    await increase(s, "workers", 1)
    await s.settle("workers")
    reload_to(s, dataclasses.replace(workers, interfaces=(NetworkInterface("public"),)))
    await increase(s, "workers", 1)
    await s.settle("workers")
    servers = sorted(await s.cloud_servers("workers"), key=lambda srv: srv["created_at"])
    networks = [[i["network"].get("uuid", "public") for i in srv["interfaces"]] for srv in servers]
    assert networks[0] == [NODES_LPG]
    assert NODES_LPG not in networks[1], networks  # was: the first resolution, cached by name


# --- 3: the fence --------------------------------------------------------------------------------


async def test_no_create_is_sent_once_the_fence_closed(stack: StackFactory) -> None:
    """A create the API throttles (429, Retry-After 1) is retried; once the replica's fence
    closes (its Lease lapsed) not one more attempt goes out, and the create fails NOT_LEADING."""
    s = await stack([group("workers", 0, 5)])
    await s.refresh()
    fence = {"open": True}
    s.provider.service.engine.use_fence(lambda: None if fence["open"] else "Lease lapsed")
    await s.admin.set_faults({"rate_limit": {"create_server": {"rate": 1.0, "retry_after": 1}}})
    await increase(s, "workers", 1)

    async def retried() -> bool:
        return await posts(s) >= 2

    await until(retried, "the create was never retried")
    fence["open"] = False
    sent = await posts(s)
    await asyncio.sleep(3.0)  # several Retry-After periods
    assert await posts(s) <= sent + 1  # at most the attempt already under way

    async def failed() -> bool:
        instances = await s.instances("workers")
        return any(i.status.errorInfo.errorCode == "NOT_LEADING" for i in instances)

    await until(failed, "the fenced create never failed")
    assert await s.cloud_servers("workers") == []


# --- 8: a create of unknown outcome ---------------------------------------------------------------


async def test_a_create_of_unknown_outcome_stays_in_the_journal_and_is_counted_after_a_restart(
    stack: StackFactory,
) -> None:
    """The API takes 5 s to carry out a create; the client gives up after 2 s and cannot find
    it. Its outcome is unknown: it stays counted and in the journal (it was a placeholder and
    left the journal), so a process restarted before the API finishes counts it too, and then
    counts the server once."""
    s = await stack([group("workers", 0, 5)], cloudscale={"timeout_seconds": 2.0})
    await s.refresh()
    s.provider.service.engine.cloud.max_retries = 0  # type: ignore[attr-defined]
    await s.admin.set_faults({"latency": {"create_server": {"fixed_ms": 5000}}})
    await increase(s, "workers", 1)

    async def recorded() -> bool:
        return len(journal_requests()) == 1

    await until(recorded, "the create was never recorded")
    [request] = journal_requests()
    await asyncio.sleep(2.5)  # the client gave up at 2 s, and its one look missed it
    assert journal_requests() == {request}
    assert await s.target("workers") == 1
    s2 = await s.restart()
    assert await s2.target("workers") == 1  # adopted: the server is not listed yet
    await s2.admin.clear_faults()

    async def listed() -> bool:
        await s2.refresh()
        return len(await s2.cloud_servers("workers")) == 1

    await until(listed, "the late server never appeared")
    assert await s2.target("workers") == 1
    assert [i.id for i in await s2.instances("workers")] == [
        f"cloudscale://{srv['uuid']}" for srv in await s2.cloud_servers("workers")
    ]


# --- 7: anti-affinity across a restart, and managed groups a reload leaves ------------------------


async def test_a_restart_counts_the_adopted_create_in_its_server_group(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    """A server group holds three members and one create of the group is in flight when the
    provider is killed. The next process counts that create in the server group (the journal
    names it), so its own next create goes into a new one; it placed a fifth member there,
    which the API refused (SERVER_GROUP_FULL)."""
    config = _anti_affine_config(tmp_path, pki, emulator)
    first = await start_serve(config)
    try:
        await _call(first, pki, "NodeGroupIncreaseSize", 3)
        await until(lambda: _servers(emulator, 3), "three servers never existed")
        await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 3000}}})
        await _call(first, pki, "NodeGroupIncreaseSize", 1)
        await until(lambda: _out(emulator, 1), "the fourth create was never sent")
    finally:
        await first.kill()
    second = await start_serve(config)
    try:
        await _call(second, pki, "NodeGroupIncreaseSize", 1)
        await emulator.admin.clear_faults()
        await until(lambda: _servers(emulator, 5), "five servers never existed")
        await asyncio.sleep(0.5)
        failed = [i for i in await _instances(second, pki) if i.id.startswith(FAILED)]
    finally:
        await second.kill()
    assert failed == [], [i.status.errorInfo.errorCode for i in failed]
    assert await _managed(emulator) == [1, 4]


async def test_a_process_that_lost_the_journal_leaves_a_new_server_group_its_creates_join(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two creates into a server group made just before the provider was killed, and the next
    process without its journal (a new emptyDir): it sees the group empty. Deleted at once, the
    creates still held at the API failed (400) and the scale-up was lost; it waits the grace
    (2 x timeoutSeconds) first."""
    config = _anti_affine_config(tmp_path, pki, emulator)
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 5000}}})
    first = await start_serve(config)
    try:
        await _call(first, pki, "NodeGroupIncreaseSize", 2)
        await until(lambda: _out(emulator, 2), "the creates were never sent")
    finally:
        await first.kill()
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "a-new-empty-dir"))
    second = await start_serve(config)
    try:
        assert await _out(emulator, 2), "the next process started too late to see them held"
        await until(lambda: _out(emulator, 0), "the creates never ended")
        await _call(second, pki, "Refresh", 0)
    finally:
        await second.kill()
    assert await _managed(emulator) == [2]
    assert len([s for s in await emulator.admin.servers() if s["name"].startswith("seams-")]) == 2


def _anti_affine_config(tmp_path: Path, pki: PKI, emulator: RunningEmulator) -> Path:
    workers = {"name": "workers", "minSize": 0, "maxSize": 8, "flavor": "flex-4-2",
               "image": "debian-12", "zone": "lpg1", "antiAffinity": True}  # fmt: skip
    return write_config(tmp_path, pki, emulator.url, TOKEN, cluster="seams", groups=[workers],
                        cloudscale={"timeoutSeconds": 3})  # fmt: skip


async def _call(serve: ServeProcess, pki: PKI, rpc: str, delta: int) -> Any:
    async with grpc_channel(pki, serve.address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        if rpc == "Refresh":
            return await stub.Refresh(pb.RefreshRequest(), timeout=10)
        request = pb.NodeGroupIncreaseSizeRequest(id="workers", delta=delta)
        return await stub.NodeGroupIncreaseSize(request, timeout=10)


async def _instances(serve: ServeProcess, pki: PKI) -> list[pb.Instance]:
    async with grpc_channel(pki, serve.address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        await stub.Refresh(pb.RefreshRequest(), timeout=10)
        reply = await stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="workers"), timeout=10)
    return list(reply.instances)


async def _servers(emulator: RunningEmulator, count: int) -> bool:
    return len(await emulator.admin.servers()) == count


async def _out(emulator: RunningEmulator, count: int) -> bool:
    return (await emulator.admin.in_flight()).get("create_server", 0) == count


async def _managed(emulator: RunningEmulator) -> list[int]:
    return sorted(
        len(g["servers"])
        for g in await emulator.admin.server_groups()
        if (g.get("tags") or {}).get(TAG_MANAGED) == "true"
    )


async def test_managed_server_groups_of_a_renamed_group_are_reported_and_the_empty_ones_go(
    stack: StackFactory,
) -> None:
    workers = group("workers", 0, 8, anti_affinity=True)
    s = await stack([workers], cloudscale={"timeout_seconds": 1.0})
    await increase(s, "workers", 5)
    await s.settle("workers")
    assert await managed(s) == [1, 4]
    # The one alone goes away: its server is deleted by hand.
    groups = await s.admin.server_groups()
    single = next(g for g in groups if len(g["servers"]) == 1 and TAG_MANAGED in g["tags"])
    await s.admin.delete_server(single["servers"][0]["uuid"])
    reload_to(s, dataclasses.replace(workers, name="pool"))

    async def tidied() -> bool:
        await s.refresh()
        return await managed(s) == [4]

    await until(tidied, "the empty server group of the renamed group was never deleted")
    left = s.provider.service.engine.removed_groups()["workers"]
    assert (left.servers, left.server_groups) == (4, 1)
