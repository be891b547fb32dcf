"""`serve` warns at start about what will not work as configured, without refusing to start."""

from __future__ import annotations

import logging

import pytest
from fixtures.stack import StackFactory, group, wait_until

from cloudscale_autoscaler.settings.types import AutoscalingOptions, NetworkInterface


async def test_unknown_flavor_image_and_zone_are_logged_at_start(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    s = await stack(
        [
            group("ok", 0, 3),
            group("bad-image", 0, 3, image="no-such-image"),
            group("bad-flavor", 0, 3, flavor="flex-999-1"),
            group("bad-zone", 0, 3, zone="xyz9"),
        ]
    )

    async def logged() -> bool:
        return "nodeGroups[3].zone" in caplog.text

    await wait_until(logged, 30, "no warning about the unknown zone")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("config: nodeG")]
    tail = ": creating servers in this node group will fail"
    assert len(lines) == 3 and all(line.endswith(tail) for line in lines), lines
    assert lines[0].startswith(
        'config: nodeGroups[1].image: unknown image "no-such-image" (known: debian-11, '
    )
    assert lines[1].startswith('config: nodeGroups[2].flavor: unknown flavor "flex-999-1"')
    assert lines[2] == f'config: nodeGroups[3].zone: unknown zone "xyz9" (known: lpg1, rma1){tail}'
    # It still serves.
    assert await s.target("ok") == 0


async def test_unknown_network_is_logged_at_start(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The same network check as check-config --online, against the emulator's networks."""
    caplog.set_level(logging.WARNING)
    s = await stack(
        [
            group("ok", 0, 3, interfaces=(NetworkInterface("k8s-nodes"),)),
            group("lost", 0, 3, interfaces=(NetworkInterface("nowhere"),)),
        ]
    )

    async def logged() -> bool:
        return "nodeGroups[1].interfaces[0]" in caplog.text

    await wait_until(logged, 30, "no warning about the unknown network")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("config: nodeG")]
    assert lines == [
        'config: nodeGroups[1].interfaces[0].network: no network named "nowhere" in zone lpg1: '
        "creating servers in this node group will fail"
    ]
    assert await s.target("ok") == 0


async def test_autoscaling_options_warned_once_naming_the_groups(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    options = AutoscalingOptions(scale_down_unneeded_seconds=300)
    await stack(
        [
            group("a", 0, 3, autoscaling_options=options),
            group("b", 0, 3),
            group("c", 0, 3, autoscaling_options=AutoscalingOptions()),
        ]
    )
    warned = [r.getMessage() for r in caplog.records if "autoscalingOptions" in r.getMessage()]
    assert len(warned) == 1
    assert "node group(s) a, c set autoscalingOptions" in warned[0]
    assert "MaxNodeStartupTime of 0" in warned[0] and "#10245" in warned[0]
