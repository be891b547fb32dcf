"""LeaderLabel's bookkeeping when leadership changes while a label write is still on its way.

The Pods are an in-memory stand-in for the Kubernetes API whose writes the test can hold: what
is under test is which writes LeaderLabel makes and what it believes afterwards, at the exact
interleavings a real API server only produces by chance (tests/test_kube_leader.py and
tests/test_kube_install.py drive it against a real one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from fixtures.stack import wait_until

from cloudscale_autoscaler.kube.api import KubeError, Obj
from cloudscale_autoscaler.kube.podlabel import LEADER_LABEL, LEADER_VALUE, LeaderLabel

NAMESPACE = "kube-system"
RETRY = 0.05


class Pods:
    """Pods and their labels; a write waits while `held` is set and counts as arriving at once."""

    def __init__(self, *names: str) -> None:
        self.labels: dict[str, dict[str, str]] = {name: {} for name in names}
        self.held: asyncio.Event | None = None
        self.arrived = 0

    async def list_pods(self, namespace: str, label_selector: str, limit: float) -> list[Obj]:
        key, value = label_selector.split("=")
        return [
            {"metadata": {"name": name}}
            for name, labels in self.labels.items()
            if labels.get(key) == value
        ]

    async def label_pod(
        self, namespace: str, name: str, labels: dict[str, str | None], limit: float
    ) -> Obj:
        self.arrived += 1
        if self.held is not None:
            await self.held.wait()
        if name not in self.labels:
            raise KubeError(f"pods {name!r} not found", 404)
        for key, value in labels.items():
            if value is None:
                self.labels[name].pop(key, None)
            else:
                self.labels[name][key] = value
        return {}

    def leader(self) -> list[str]:
        return sorted(n for n, labels in self.labels.items() if labels.get(LEADER_LABEL))


@contextlib.asynccontextmanager
async def running(label: LeaderLabel) -> AsyncIterator[None]:
    task = asyncio.create_task(label.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def settled(pods: Pods, expected: list[str]) -> None:
    async def there() -> bool:
        return pods.leader() == expected

    await wait_until(there, 5, f"the leader label never came to rest on {expected}")
    await asyncio.sleep(RETRY * 4)  # and stays there: nothing left to undo it
    assert pods.leader() == expected


@pytest.mark.parametrize("changes", [[True], [True, False], [True, False, True]])
async def test_a_change_during_a_write_in_flight_is_applied_after_it(changes: list[bool]) -> None:
    pods = Pods("a", "b")
    label = LeaderLabel(pods, NAMESPACE, "a", RETRY)
    pods.held = asyncio.Event()
    async with running(label):
        # The first pass (removing a label left from an earlier run) is on its way...
        async def sent() -> bool:
            return pods.arrived >= 1

        await wait_until(sent, 5, "the start-up unlabel never went out")
        # ...when leadership comes (and maybe goes again).
        for leading in changes:
            label.want(leading)
        pods.held.set()
        await settled(pods, ["a"] if changes[-1] else [])


async def test_a_leader_takes_the_label_off_a_dead_leaders_pod() -> None:
    pods = Pods("a", "b")
    pods.labels["b"][LEADER_LABEL] = LEADER_VALUE  # b was killed while leading
    label = LeaderLabel(pods, NAMESPACE, "a", RETRY)
    async with running(label):
        label.want(True)
        await settled(pods, ["a"])
        label.want(False)
        await settled(pods, [])


async def test_a_failed_write_is_retried_until_it_succeeds() -> None:
    pods = Pods("a")
    failures = [KubeError("connection refused")] * 3  # no answer: status 0, retried
    original = pods.label_pod

    async def flaky(namespace: str, name: str, labels: dict[str, str | None], limit: float) -> Obj:
        if failures:
            raise failures.pop()
        return await original(namespace, name, labels, limit)

    pods.label_pod = flaky  # type: ignore[method-assign]
    label = LeaderLabel(pods, NAMESPACE, "a", RETRY)
    async with running(label):
        label.want(True)
        await settled(pods, ["a"])
    assert not failures
