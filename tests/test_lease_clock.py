"""Leader election (kube/lease.py) on a clock of whole ticks: the seams campaign's virtual
clock (looptime, 1 µs ticks), where a renew deadline computed in floating point can lie a
hair past the tick the loop reaches. In-memory Lease API (tests/campaign/seams/kubedouble.py);
the Elector runs as `serve` runs it, on the loop's own clock.
"""

from __future__ import annotations

import asyncio

import pytest
from campaign.seams.clock import VirtualLoop
from campaign.seams.kubedouble import KubeDouble

from cloudscale_autoscaler.kube.lease import Elector
from cloudscale_autoscaler.service.serving import Serving
from cloudscale_autoscaler.settings.types import LeaderElectionConfig

# Acquired here, the default renewDeadline (10 s) added in floating point gives
# 1028.5891350000002, one ulp past the tick 1028.589135 the loop reaches by sleeping.
ACQUIRED_AT = 1018.589135


async def nothing() -> None:
    pass


# Long run seed 505, schedule 23: the old code spun in its renew loop for ever, virtual time
# standing still (so no virtual limit ends it); this real-time limit makes that a failure.
@pytest.mark.timeout(30)
def test_a_leader_cut_off_stands_down_at_its_renew_deadline_on_a_ticking_clock(
    vloop: VirtualLoop,
) -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(ACQUIRED_AT - loop.time())
        view = KubeDouble().view("a")
        stood_down: list[float] = []
        elector = Elector(
            view,
            LeaderElectionConfig(enabled=True),
            "kube-system",
            "a",
            Serving("kube-system/cloudscale-autoscaler", clock=loop.time),
            nothing,
            lambda: stood_down.append(loop.time()),
            clock=loop.time,
        )
        running = asyncio.create_task(elector.run())
        try:
            await asyncio.sleep(1.0)
            assert elector.leading
            view.cut = True  # every renewal fails from now on
            await asyncio.sleep(15.0)  # past the renew deadline and the Lease's duration
            assert not elector.leading
            return stood_down
        finally:
            running.cancel()

    stood_down = vloop.run(scenario(), limit=ACQUIRED_AT + 60)
    assert stood_down == [pytest.approx(ACQUIRED_AT + 10.0, abs=0.002)]
