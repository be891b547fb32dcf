"""A `serve` restarted while its creates are in flight counts them: the creation journal in
`stateDir` (journal/file.py), with real processes killed by SIGKILL and restarted at once,
against an emulator whose creates take a while.

The API lists a server only once its create has been carried out; without the journal a
restarted provider answers a target without the creates still in flight, and CA (played here
by the test) asks for the same servers again, past maxSize at worst.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from campaign.serve import ServeProcess, start_serve, write_config
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.stack import wait_until
from fixtures.tls import PKI, grpc_channel
from test_shutdown import assert_tagged

from cloudscale_autoscaler.cloud.models import TAG_DELETION, TAG_REQUEST
from cloudscale_autoscaler.engine.providerid import placeholder_provider_id
from cloudscale_autoscaler.journal.entries import Entry, decode, encode
from cloudscale_autoscaler.journal.file import FILE_NAME
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc

CLUSTER = "journal"
MAX_SIZE = 6
CREATE_MS = 1200
# The client's timeout; an adopted create is counted for twice this (ADOPTED_BOUND_FACTOR).
TIMEOUT_SECONDS = 1.5
CALL_TIMEOUT = 10.0
KILLS = 20
# Kills that must find creates the API is carrying out (the rest land before or after).
KILLS_IN_FLIGHT = 15
PLACEHOLDER_PREFIX = placeholder_provider_id("")


def config_for(
    tmp_path: Path,
    pki: PKI,
    emulator: RunningEmulator,
    cloudscale_extra: dict[str, Any] | None = None,
    *,
    state_dir: bool = True,
    **top: Any,
) -> Path:
    """The config; without `state_dir`, none (the journal in its default place)."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    if state_dir:
        top["stateDir"] = str(state)
    group = {"name": "workers", "minSize": 0, "maxSize": MAX_SIZE, "flavor": "flex-4-2",
             "image": "debian-12", "zone": "lpg1"}  # fmt: skip
    return write_config(
        tmp_path, pki, emulator.url, TOKEN, cluster=CLUSTER, groups=[group],
        cloudscale={"timeoutSeconds": TIMEOUT_SECONDS, **(cloudscale_extra or {})}, **top,
    )  # fmt: skip


class Ca:
    """What CA does with a provider: Refresh, read the target, ask for more, delete the
    placeholders of failed creations."""

    def __init__(self, serve: ServeProcess, pki: PKI) -> None:
        self.channel = grpc_channel(pki, serve.address)
        self.stub = pb_grpc.CloudProviderStub(self.channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self.channel.close(None)

    async def target(self) -> int:
        await self.stub.Refresh(pb.RefreshRequest(), timeout=CALL_TIMEOUT)
        reply = await self.stub.NodeGroupTargetSize(
            pb.NodeGroupTargetSizeRequest(id="workers"), timeout=CALL_TIMEOUT
        )
        return int(reply.targetSize)

    async def increase(self, delta: int) -> None:
        request = pb.NodeGroupIncreaseSizeRequest(id="workers", delta=delta)
        await self.stub.NodeGroupIncreaseSize(request, timeout=CALL_TIMEOUT)

    async def instances(self) -> list[pb.Instance]:
        reply = await self.stub.NodeGroupNodes(
            pb.NodeGroupNodesRequest(id="workers"), timeout=CALL_TIMEOUT
        )
        return list(reply.instances)

    async def delete_some(self, count: int, emulator: RunningEmulator) -> int:
        """Delete up to `count` servers as CA deletes idle nodes; how many, once gone."""
        servers = [s for s in await emulator.admin.servers() if TAG_DELETION not in s["tags"]]
        chosen = servers[:count]
        if not chosen:
            return 0
        nodes = [pb.ExternalGrpcNode(providerID=f"cloudscale://{s['uuid']}", name=s["name"])
                 for s in chosen]  # fmt: skip
        request = pb.NodeGroupDeleteNodesRequest(id="workers", nodes=nodes)
        await self.stub.NodeGroupDeleteNodes(request, timeout=CALL_TIMEOUT)
        gone = {s["uuid"] for s in chosen}

        async def deleted() -> bool:
            return not gone & {s["uuid"] for s in await emulator.admin.servers()}

        await wait_until(deleted, 10, "the deleted servers are still listed")
        return len(chosen)

    async def delete_placeholders(self) -> list[pb.Instance]:
        failed = [i for i in await self.instances() if i.id.startswith(PLACEHOLDER_PREFIX)]
        if failed:
            nodes = [pb.ExternalGrpcNode(providerID=i.id, name=i.id) for i in failed]
            request = pb.NodeGroupDeleteNodesRequest(id="workers", nodes=nodes)
            await self.stub.NodeGroupDeleteNodes(request, timeout=CALL_TIMEOUT)
        return failed


async def cloud_count(emulator: RunningEmulator) -> tuple[int, int]:
    """(servers that exist and are not being deleted, creates the API is still carrying
    out)."""
    servers = [s for s in await emulator.admin.servers() if TAG_DELETION not in s["tags"]]
    return len(servers), (await emulator.admin.in_flight()).get("create_server", 0)


async def api_idle(emulator: RunningEmulator) -> None:
    async def idle() -> bool:
        return not (await emulator.admin.in_flight()).get("create_server", 0)

    await wait_until(idle, 30, "the API is still creating")


async def test_a_restart_at_once_counts_the_creates_in_flight(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    config = config_for(tmp_path, pki, emulator)
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 3000}}})
    first = await start_serve(config, log_level="info")
    try:
        ca = Ca(first, pki)
        assert await ca.target() == 0
        await ca.increase(3)
        await wait_until(lambda: _in_flight(emulator, 3), 10, "the creates never reached the API")
        await ca.close()
    finally:
        await first.kill()
    second = await start_serve(config, log_level="info")  # at once: the API is still creating
    try:
        ca = Ca(second, pki)
        assert await cloud_count(emulator) == (0, 3)
        assert await ca.target() == 3, second.output  # not 0: CA would plan the same 3 again
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ca.increase(MAX_SIZE - 2)  # 3 + 4 > maxSize 6, though nothing is listed yet
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "sent by an earlier process and not listed yet" in second.output
        await api_idle(emulator)
        assert await ca.target() == 3
        servers = await emulator.admin.servers()
        assert len(servers) == 3
        assert_tagged(servers, CLUSTER)
        await ca.close()
    finally:
        await second.kill()


async def _in_flight(emulator: RunningEmulator, count: int) -> bool:
    return (await emulator.admin.in_flight()).get("create_server", 0) == count


async def test_creates_never_sent_become_failed_placeholders_after_the_bound(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    """maxConcurrentCreates 1: of 3 recorded creates one reaches the API, two never leave the
    killed process. The next one counts all three until the bound, then shows the two as
    failed instances (class Other, code CREATE_UNCONFIRMED), which CA deletes."""
    config = config_for(tmp_path, pki, emulator, cloudscale_extra={"maxConcurrentCreates": 1})
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 1000}}})
    first = await start_serve(config, log_level="info")
    try:
        ca = Ca(first, pki)
        await ca.target()
        await ca.increase(3)
        await wait_until(
            lambda: _in_flight(emulator, 1), 10, "the first create never reached the API"
        )
        await ca.close()
    finally:
        await first.kill()
    second = await start_serve(config, log_level="info")
    try:
        ca = Ca(second, pki)
        assert await ca.target() == 3
        await api_idle(emulator)
        assert len(await emulator.admin.servers()) == 1

        async def two_failed() -> bool:
            await ca.target()
            return (
                len([i for i in await ca.instances() if i.id.startswith(PLACEHOLDER_PREFIX)]) == 2
            )

        await wait_until(two_failed, 4 * TIMEOUT_SECONDS + 5, "the unsent creates never failed")
        failed = [i for i in await ca.instances() if i.id.startswith(PLACEHOLDER_PREFIX)]
        for instance in failed:
            info = instance.status.errorInfo
            assert info.errorCode == "CREATE_UNCONFIRMED", instance
            assert info.instanceErrorClass == 99, instance  # OtherErrorClass
            assert "recorded" in info.errorMessage and "not listed within 3s" in info.errorMessage
        assert await ca.target() == 3
        await ca.delete_placeholders()
        assert await ca.target() == 1
        await ca.close()
    finally:
        await second.kill()


async def test_a_journal_that_cannot_be_written_refuses_the_scale_up(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    """No create is sent that the journal does not hold: IncreaseSize answers UNAVAILABLE
    naming the file, the target rolls back, the API received nothing (the wait is long enough
    for the failed write, fsync included, to be the verdict)."""
    config = config_for(tmp_path, pki, emulator, increaseSizeWait="3s")
    serve = await start_serve(config, log_level="info")
    try:
        ca = Ca(serve, pki)
        await ca.target()
        record = tmp_path / "state" / FILE_NAME
        record.unlink()
        record.mkdir()  # the rename that writes it now fails, even for root
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ca.increase(2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert str(record) in (refused.value.details() or ""), refused.value.details()
        assert await ca.target() == 0
        assert (await emulator.admin.stats()).get("create_server") is None
        await ca.close()
    finally:
        await serve.kill()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"format":1,"cluster":"journal","holder":"x","creations":[{"request":"ab', "not JSON"),
        ('{"format":1,"cluster":"other","holder":"x","creations":[]}', "foreign"),
        ('{"format":1,"cluster":"journal","holder":"x","creations":[{"request":1}]}',
         "creations[0]: expected"),
    ],
    ids=["truncated", "foreign", "bad-entry"],
)  # fmt: skip
async def test_a_bad_journal_is_a_clear_log_line_not_a_crash(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator, content: str, problem: str
) -> None:
    """Not a crash, and no scale-up until creates it may have held would have been listed
    (2 x timeoutSeconds): counting none of them could have doubled a scale-up (a dead
    process's creates still under way at the API; found by the seams campaign)."""
    config = config_for(tmp_path, pki, emulator)
    (tmp_path / "state" / FILE_NAME).write_text(content)
    serve = await start_serve(config, log_level="info")
    try:
        ca = Ca(serve, pki)
        assert await ca.target() == 0
        with pytest.raises(grpc.aio.AioRpcError) as held:
            await ca.increase(1)
        assert held.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the creation journal could not be read whole" in (held.value.details() or "")

        async def scales_up() -> bool:  # CA's loop: a Refresh, then the scale-up
            try:
                await ca.target()
                await ca.increase(1)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                return False
            return True

        await wait_until(scales_up, 10 * TIMEOUT_SECONDS, "the hold never ended")
        await ca.close()
        lines = [line for line in serve.output.splitlines() if "creation journal" in line]
        assert any(problem in line and FILE_NAME in line for line in lines), serve.output
    finally:
        await serve.kill()
    # Written again whole, for this cluster: the next process reads it without a problem.
    assert decode((tmp_path / "state" / FILE_NAME).read_text(), CLUSTER).problems == []


@pytest.mark.parametrize("place", ["stateDir", "default"])
async def test_killed_at_random_points_and_restarted_at_once_never_overshoots(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator, place: str
) -> None:
    """KILLS times: CA removes a few servers, then asks for a random size up to maxSize, and
    the provider is killed with SIGKILL at a random moment of that batch (mostly while the
    creates are out, sometimes before its answer or after) and started again at once. After
    every restart the target it answers covers every server that exists or is still being
    created, so CA never asks for them twice, and they are never more than maxSize; at the end
    the cloud holds at most maxSize servers, each made once. `default`: no config key about
    the journal at all (it is in its default place, $STATE_DIRECTORY here)."""
    if place == "stateDir":
        config = config_for(tmp_path, pki, emulator)
    else:
        config = config_for(tmp_path, pki, emulator, state_dir=False)
    await emulator.admin.set_faults(
        {"latency": {"create_server": {"fixed_ms": CREATE_MS, "jitter_ms": CREATE_MS}}}
    )
    rng = random.Random(30)
    seen_max, checks, landed = 0, [], 0
    serve = await start_serve(config, log_level="info")
    try:
        for run in range(KILLS):
            ca = Ca(serve, pki)
            await ca.delete_placeholders()
            target = await ca.target()
            existing, creating = await cloud_count(emulator)
            checks.append((run, target, existing, creating))
            assert existing + creating <= min(target, MAX_SIZE), f"run {run}: {checks}"
            seen_max = max(seen_max, existing + creating)
            target -= await ca.delete_some(rng.randint(0, 2), emulator)
            wanted = rng.randint(min(target + 1, MAX_SIZE), MAX_SIZE)
            call = asyncio.ensure_future(ca.increase(wanted - target)) if wanted > target else None
            out = CREATE_MS / 1000 if rng.random() < 0.8 else 2 * CREATE_MS / 1000
            await asyncio.sleep(rng.uniform(0.1, out))
            landed += (await emulator.admin.in_flight()).get("create_server", 0) > 0
            await serve.kill()
            if call is not None:
                await asyncio.gather(call, return_exceptions=True)  # answered, or cut off
            await ca.close()
            serve = await start_serve(config, log_level="info")
        await api_idle(emulator)
        ca = Ca(serve, pki)
        await ca.delete_placeholders()
        final = await ca.target()
        await ca.close()
    finally:
        await serve.kill()
    servers = await emulator.admin.servers()
    print(f"{KILLS} kills ({place}), {landed} with creates in flight at the API: at most "
          f"{seen_max} servers existing or in creation (maxSize {MAX_SIZE}); {len(servers)} "
          f"at the end, target {final}; per run {checks}")  # fmt: skip
    assert landed >= KILLS_IN_FLIGHT, f"only {landed} of {KILLS} kills found creates in flight"
    assert len(servers) <= MAX_SIZE
    assert len(servers) <= final
    assert_tagged(servers, CLUSTER)
    assert max(Counter(s["tags"][TAG_REQUEST] for s in servers).values()) == 1


async def test_creates_of_a_group_configured_only_later_are_kept_and_counted(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    """A replica whose config lags (a standby taking over before the kubelet brought it the
    ConfigMap with a new group) reads creates of that group in the journal: it keeps them in
    the journal while their bound lasts, and counts them once a reload adds the group, instead
    of dropping them (that group's scale-up would then be planned twice)."""
    config = config_for(tmp_path, pki, emulator, cloudscale_extra={"timeoutSeconds": 15})
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    earlier = Entry("0123456789abcdef0123456789abcdef", "extra", f"{CLUSTER}-extra-ab12c", at)
    record = tmp_path / "state" / FILE_NAME
    record.write_text(encode(CLUSTER, "an-earlier-process", [earlier]))
    serve = await start_serve(config, log_level="info")
    try:
        ca = Ca(serve, pki)
        assert await ca.target() == 0
        await ca.increase(1)  # the journal is written with the workers' create, then without

        async def written_after_it() -> bool:
            entries = decode(record.read_text(), CLUSTER).entries
            return len(await emulator.admin.servers()) == 1 and all(
                entry.group != "workers" for entry in entries
            )

        await wait_until(written_after_it, 10, "the workers' create never left the journal")
        assert decode(record.read_text(), CLUSTER).entries == [earlier], record.read_text()
        document = yaml.safe_load(config.read_text())
        document["nodeGroups"].append({**document["nodeGroups"][0], "name": "extra"})
        staged = config.with_suffix(".new")
        staged.write_text(yaml.safe_dump(document))
        staged.replace(config)

        async def counted() -> bool:
            request = pb.NodeGroupTargetSizeRequest(id="extra")
            try:
                answer = await ca.stub.NodeGroupTargetSize(request, timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError:
                return False  # not reloaded yet: no such group
            return answer.targetSize == 1

        await wait_until(counted, 15, "the kept create of the added group was never counted")
        await ca.close()
    finally:
        await serve.kill()
