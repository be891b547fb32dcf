"""The seams campaign (tests/campaign/seams/): two replicas of the real provider sharing a
Lease and a journal, reloads, kills, damaged journals and cloud faults, interleaved with CA's
calls, in virtual time.

    pytest tests/test_campaign_seams.py                              # CI: the "ci" profile
    pytest -m campaign --hypothesis-profile=long                     # >= 10,000 schedules

A failing schedule is printed step by step with the blob that replays it
(`@reproduce_failure(...)`, print_blob); `--hypothesis-seed=N` replays a whole run.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import fixtures.hypothesis_profiles  # noqa: F401  (registers "ci" and "long")
import pytest
from campaign.logs import forget_earlier_examples
from campaign.memory import providers_left
from campaign.seams.clock import VirtualLoop
from campaign.seams.machine import SeamsMachine
from campaign.seams.world import TOKEN, Schedule
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from cloudscale_autoscaler.cloud.emulator.server import Emulator

pytestmark = pytest.mark.campaign


def seams_settings() -> settings:
    """The profile chosen with --hypothesis-profile ("long"), else "seams-ci"."""
    name = settings.get_current_profile_name()
    return settings.get_profile("seams-ci" if name == "default" else f"seams-{name}")


@pytest.fixture
def emulator(vloop: VirtualLoop) -> Iterator[Emulator]:
    emu = Emulator(token=TOKEN, seed=0, boot_seconds=0.0)

    async def start() -> None:
        await emu.start("127.0.0.1", 0)
        emu.state.clock = vloop.loop.time  # lingering deletions in virtual time

    vloop.run(start())
    try:
        yield emu
    finally:
        vloop.run(emu.stop())


# A spin in the provider stops the virtual clock, so no step's virtual limit ends it (the long
# run of seed 505 hung so in the renew loop): a real-time limit does, except for the long
# profile, which runs for hours. The CI profile takes well under a minute.
REAL_LIMIT_SECONDS = 0 if settings.get_current_profile_name() == "long" else 600


@pytest.mark.timeout(REAL_LIMIT_SECONDS)
def test_seams_campaign(
    vloop: VirtualLoop, emulator: Emulator, tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    serial = itertools.count()
    forget_logs = forget_earlier_examples(pytestconfig)

    def make() -> Schedule:
        emulator.state.reset()
        return Schedule(vloop, emulator, tmp_path / f"schedule-{next(serial)}")

    def machine() -> SeamsMachine:
        forget_logs()
        return SeamsMachine(make)

    started = time.monotonic()
    try:
        run_state_machine_as_test(machine, settings=seams_settings())
        forget_logs()  # the last schedule's records hold its replicas
        assert providers_left() == {}  # every schedule killed its replicas
    finally:
        print(
            f"\nseams campaign: {SeamsMachine.schedules} schedules, {SeamsMachine.steps} checked "
            f"states, {SeamsMachine.calls} CA calls ({SeamsMachine.unrouted} found no replica "
            f"serving) in {time.monotonic() - started:.0f} s"
        )


# --- regressions: what the long runs found, replayed step by step -----------------------------


def replay(m: SeamsMachine, steps: list[Callable[[], None]]) -> None:
    """A failing schedule's steps, each followed by the checks the campaign runs after it,
    then its end (liveness and convergence)."""
    try:
        for step in steps:
            step()
            m.consistent()
    finally:
        m.teardown()


def test_a_slow_create_cut_off_is_not_sent_again(
    vloop: VirtualLoop, emulator: Emulator, tmp_path: Path
) -> None:
    """Long run #2: the leader's link to the API breaks while a create it sent is still being
    carried out (8 s); the lookup after the broken connection misses the server, which proved
    nothing, and the create was sent again: one request, two servers. Now it is looked for
    until it is listed, never sent again."""
    emulator.state.reset()
    m = SeamsMachine(lambda: Schedule(vloop, emulator, tmp_path / "schedule"))
    steps: list[Callable[[], None]] = [
        lambda: m.start_with_faults({"latency": {"create_server": {"fixed_ms": 8000}}}, 0),
        lambda: m.scale_up(delta=1, index=0, pause=0.0),
        lambda: m.wait(duration=0.05),
        lambda: m.pods(demand=1, index=5),
        lambda: m.scale_down(count=1, failed_only=False, index=0, pause=10.0),
        lambda: m.stop(role="other"),
        lambda: m.scale_down(count=3, failed_only=False, index=1, pause=0.0),
        lambda: m.cloud_link(cut=True, role="leader"),
        lambda: m.cloud_link(cut=False, role="leader"),
        lambda: m.scale_down(count=1, failed_only=False, index=0, pause=2.0),
        lambda: m.cloud_faults(faults={"quota": {"max_servers": 3}}),
    ]
    replay(m, steps)


def test_a_hold_outlives_the_holder_that_began_it(
    vloop: VirtualLoop, emulator: Emulator, tmp_path: Path
) -> None:
    """Long run #3: the journal is overwritten with garbage while creates (2 to 3 s each)
    are in flight, and the leader is killed mid scale-up, again and again. The replica that
    claimed the garbage held scale-ups, wrote a whole record and died during its hold; the
    next one read that record, which lacked the dead leader's creates, and held nothing: 6
    servers for maxSize 4. The hold is now written into the record until it ends."""
    emulator.state.reset()
    m = SeamsMachine(lambda: Schedule(vloop, emulator, tmp_path / "schedule"))
    steps: list[Callable[[], None]] = [
        lambda: m.start_with_faults({"latency": {"create_server": {"fixed_ms": 2000}}}, 6),
        lambda: m.cloud_link(cut=False, role="leader"),
        lambda: m.scale_up(delta=1, index=0, pause=0.0),
        lambda: m.damage_journal(damage="garbage"),
        lambda: m.damage_journal(damage="garbage"),
        lambda: m.damage_journal(damage="garbage"),
        lambda: m.kill(delay=0.0, iterations=0, mid_scale_up=True, role="leader"),
        lambda: m.crash_and_restart(delay=0.0, iterations=0, mid_scale_up=True, role="leader"),
        lambda: m.cloud_faults(faults={"latency": {"create_server": {"fixed_ms": 3000}}}),
        lambda: m.refresh(pause=10.0),
        lambda: m.damage_journal(damage="garbage"),
        lambda: m.damage_journal(damage="garbage"),
        lambda: m.crash_and_restart(delay=0.0, iterations=0, mid_scale_up=True, role="leader"),
        lambda: m.refresh(pause=0.0),
        lambda: m.crash_and_restart(delay=0.0, iterations=0, mid_scale_up=True, role="leader"),
        lambda: m.wait(duration=0.05),
        lambda: m.cloud_faults(faults={"latency": {"create_server": {"fixed_ms": 3000}}}),
        lambda: m.scale_up(delta=1, index=0, pause=10.0),
    ]
    replay(m, steps)


def test_a_hold_ends_with_a_listing_begun_after_it(
    vloop: VirtualLoop, emulator: Emulator, tmp_path: Path
) -> None:
    """Long run #4 (after the hold fix), at schedule 1,406: creates slower (8 s) than the
    client's timeout (5 s), the journal overwritten with garbage, the leader cut off from the
    Kubernetes API and restarted mid scale-up, so its successor holds scale-ups. The hold
    ended by the clock, and the IncreaseSize after it counted the servers of a listing begun
    before the dead leader's last create was carried out: 5 servers for maxSize 4. A hold
    now ends only with a listing begun after its end."""
    emulator.state.reset()
    m = SeamsMachine(lambda: Schedule(vloop, emulator, tmp_path / "schedule"))
    steps: list[Callable[[], None]] = [
        lambda: m.start_with_faults({"latency": {"create_server": {"fixed_ms": 8000}}}, 1),
        lambda: m.damage_journal(damage="garbage"),
        lambda: m.refresh(pause=10.0),
        lambda: m.scale_up(delta=1, index=0, pause=2.0),
        lambda: m.wait(duration=5.0),
        lambda: m.damage_journal(damage="garbage"),
        lambda: m.cloud_link(cut=False, role="leader"),
        lambda: m.kube_link(cut=True, role="leader"),
        lambda: m.crash_and_restart(delay=2.0, iterations=45, mid_scale_up=True, role="leader"),
        lambda: m.damage_journal(damage="deep"),
        lambda: m.scale_up(delta=1, index=2, pause=2.0),
        lambda: m.scale_up(delta=3, index=4, pause=10.0),
        lambda: m.cloud_heals(),
    ]
    replay(m, steps)
