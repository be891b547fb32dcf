"""A restart never turns a deletion into a creation.

The provider tags a server (k8s-autoscaler-deletion-requested) before deleting it, so the
cloud alone says which deletions were requested: a restarted provider reports those servers as
deleting, leaves them out of the target and finishes their deletion. The tag is an extra API
call; each way it can be lost is tested with the emulator's faults.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from fixtures.stack import StackFactory, group, group_tags, wait_until
from test_engine_races import node

from cloudscale_autoscaler.cloud.models import TAG_DELETION, Server
from cloudscale_autoscaler.engine import instances
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

CREATING = pb.InstanceStatus.instanceCreating
DELETING = pb.InstanceStatus.instanceDeleting


async def _delete(s: object, uuids: list[str]) -> None:
    request = pb.NodeGroupDeleteNodesRequest(id="workers", nodes=[node(u) for u in uuids])
    await s.stub.NodeGroupDeleteNodes(request)  # type: ignore[attr-defined]


async def test_restart_during_slow_deletions_reports_them_deleting(stack: StackFactory) -> None:
    s = await stack([group("workers", 1, 10)])
    uuids = await s.admin.populate(3, group_tags("workers"))
    await s.refresh()
    # Long enough for the restart and the checks below, even on a loaded machine.
    await s.admin.set_faults({"slow_deletes_seconds": 8})
    await _delete(s, uuids[:2])
    assert await s.target("workers") == 1

    s2 = await s.restart()
    await s2.refresh()
    assert await s2.target("workers") == 1
    states = {
        i.id.removeprefix("cloudscale://"): i.status.instanceState
        for i in await s2.instances("workers")
    }
    assert states[uuids[0]] == DELETING and states[uuids[1]] == DELETING
    assert CREATING not in states.values()
    # The restarted provider finishes the deletions: it sent them again (idempotent).
    assert (await s2.admin.stats())["delete_server"]["204"] == 4

    async def gone() -> bool:
        await s2.refresh()
        return len(await s2.cloud_servers("workers")) == 1

    await wait_until(gone, 30, "the restarted provider did not finish the deletions")
    assert await s2.target("workers") == 1


@pytest.mark.parametrize("refused", ["patch_server", "delete_server"])
async def test_refused_tag_or_delete_leaves_the_server_as_it_was(
    stack: StackFactory, refused: str
) -> None:
    """The API refused (403, final): nothing was deleted, so no tag may stay behind."""
    s = await stack([group("workers", 0, 10)])
    uuids = await s.admin.populate(2, group_tags("workers"))
    await s.refresh()
    await s.admin.set_faults({"error_rate": {refused: {"rate": 1.0, "status": 403}}})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _delete(s, uuids[:1])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    await s.admin.clear_faults()
    await s.refresh()
    assert await s.target("workers") == 2
    assert all(TAG_DELETION not in srv["tags"] for srv in await s.admin.servers())
    assert await s.admin.deletions() == []


async def test_tag_whose_answer_is_lost_is_undone(stack: StackFactory) -> None:
    """Every tag request reaches the API and is carried out, but each answer comes after the
    client gave up: the provider cannot know, so it puts the old tags back (also carried out,
    after the tag) and reports the deletion failed; nothing is deleted."""
    s = await stack([group("workers", 0, 10)], cloudscale={"timeout_seconds": 0.2})
    uuids = await s.admin.populate(2, group_tags("workers"))
    await s.refresh()
    await s.admin.set_faults({"latency": {"patch_server": {"fixed_ms": 400}}})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _delete(s, uuids[:1])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

    async def idle() -> bool:
        return not (await s.admin.in_flight()).get("patch_server", 0)

    await wait_until(idle, 30, "the tag requests are still being carried out")
    await s.admin.clear_faults()
    assert (await s.admin.stats())["patch_server"]["204"] >= 2  # tagged, then untagged
    await s.refresh()
    assert all(TAG_DELETION not in srv["tags"] for srv in await s.admin.servers())
    assert await s.target("workers") == 2
    assert await s.admin.deletions() == []


async def test_delete_lost_is_finished_by_refresh(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)])
    uuids = await s.admin.populate(2, group_tags("workers"))
    await s.refresh()
    # 503 on every DELETE: the client retries, gives up, and cannot know the outcome.
    await s.admin.set_faults({"error_rate": {"delete_server": {"rate": 1.0, "status": 503}}})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _delete(s, uuids[:1])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # The request is on the server: counted out of the target, reported deleting...
    s2 = await s.restart()
    await s2.admin.clear_faults()
    states = {
        i.id.removeprefix("cloudscale://"): i.status.instanceState
        for i in await s2.instances("workers")
    }
    assert states[uuids[0]] == DELETING
    assert await s2.target("workers") == 1

    # ... and the next Refresh finishes it.
    async def deleted() -> bool:
        await s2.refresh()
        return [d["uuid"] for d in await s2.admin.deletions()] == [uuids[0]]

    await wait_until(deleted, 30, "the tagged server was not deleted")
    assert await s2.target("workers") == 1


def _server(status: str, created: datetime) -> Server:
    return Server(
        "47cec963-fcd2-482f-bdb6-24461b2d47b1", "n", status, created_at=created.isoformat()
    )


@pytest.mark.parametrize(
    ("status", "age_seconds", "state"),
    [
        ("changing", 30, instances.CREATING),
        ("changing", instances.BOOT_WINDOW_SECONDS - 60, instances.CREATING),
        ("changing", instances.BOOT_WINDOW_SECONDS + 60, instances.RUNNING),
        ("changing", 86400, instances.RUNNING),
        ("running", 86400, instances.RUNNING),
        ("error", 86400, instances.CREATING),
    ],
)
def test_changing_long_after_creation_is_not_creating(
    status: str, age_seconds: float, state: int
) -> None:
    now = time.time()
    server = _server(status, datetime.fromtimestamp(now - age_seconds, tz=UTC))
    booting = instances.booting(server, now)
    assert instances.server_instance(server, False, booting).status.instanceState == state
    unreadable = Server(server.uuid, "n", status, created_at="yesterday")
    assert instances.booting(unreadable, now)
    assert timedelta(seconds=instances.BOOT_WINDOW_SECONDS) == timedelta(minutes=15)
