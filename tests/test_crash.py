"""kill -9 of `cloudscale-autoscaler serve` (a real process) while creates are in flight.

The emulator carries out every create it received although the client died, as a real API
does. After a restart and a Refresh: every server that exists carries the cluster, group and
request tags, the target equals what exists, and nothing is duplicated.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from campaign.serve import start_serve, write_config
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.stack import wait_until
from fixtures.tls import PKI
from test_shutdown import GROUP, assert_tagged, group_view, serve_with_creates_in_flight

from cloudscale_autoscaler.cloud.models import TAG_REQUEST

CLUSTER = "crash"
IN_FLIGHT = 3


async def test_kill_9_during_increase_size(
    tmp_path: Path, pki: PKI, emulator: RunningEmulator
) -> None:
    config = write_config(
        tmp_path, pki, emulator.url, TOKEN, cluster=CLUSTER, groups=[GROUP],
        cloudscale={"maxConcurrentCreates": IN_FLIGHT},
    )  # fmt: skip
    first = await serve_with_creates_in_flight(config, pki, emulator, 6, IN_FLIGHT, 1500)
    await first.kill()  # SIGKILL: nothing is finished, nothing is cleaned up
    assert first.process.returncode == -9

    async def api_idle() -> bool:
        return not (await emulator.admin.in_flight()).get("create_server", 0)

    await wait_until(api_idle, 30, "the API is still creating")
    await emulator.admin.clear_faults()
    # Every create the API received was carried out; the three still queued were never sent.
    assert (await emulator.admin.stats())["create_server"] == {"201": IN_FLIGHT}
    servers = await emulator.admin.servers()
    assert len(servers) == IN_FLIGHT
    assert_tagged(servers, CLUSTER)
    assert max(Counter(s["tags"][TAG_REQUEST] for s in servers).values()) == 1
    assert max(Counter(s["name"] for s in servers).values()) == 1
    # The next process also counts the three the dead one had recorded in its journal (the
    # default place: no stateDir is set) and never sent, until 2 x timeoutSeconds pass: it
    # cannot tell them from creates the API is still carrying out.
    second = await start_serve(config, log_level="info")
    try:
        size, ids = await group_view(second.address, pki)
    finally:
        await second.stop()
    assert size == 6
    assert ids == {f"cloudscale://{s['uuid']}" for s in servers}
    # Adopted before the first listing, which then finds three of them as servers.
    assert "6 create(s) of node group workers sent by an earlier process" in second.output
