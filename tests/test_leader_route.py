"""LeaderRoute's writes to the gRPC Service's EndpointSlice when leadership changes while a
write is on its way, when another replica leads, and when a write fails.

The EndpointSlice is an in-memory stand-in for the Kubernetes API whose writes the test can
hold, applying merge patches and JSON patches (`test` and `replace`) as the API does: what is
under test is which writes LeaderRoute makes and what it believes afterwards, at the exact
interleavings a real API server only produces by chance (tests/test_kube_leader.py and
tests/test_kube_install.py drive it against a real one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fixtures.stack import wait_until

from cloudscale_autoscaler.kube.api import KubeError, Obj
from cloudscale_autoscaler.kube.route import TEST_FAILED, LeaderRoute, pod_endpoint

NAMESPACE = "kube-system"
NAME = "provider"
RETRY = 0.05


def endpoint(pod: str) -> Obj:
    return pod_endpoint(f"10.0.0.{ord(pod[0])}", NAMESPACE, pod, f"uid-{pod}")


class Slice:
    """One EndpointSlice's endpoints; a write waits while `held` is set."""

    def __init__(self, *pods: str) -> None:
        self.endpoints: list[Obj] = [endpoint(pod) for pod in pods]
        self.held: asyncio.Event | None = None
        self.arrived = 0
        self.failures: list[KubeError] = []

    async def patch_endpoint_slice(
        self, namespace: str, name: str, patch: Obj | list[Obj], limit: float
    ) -> Obj:
        self.arrived += 1
        if self.held is not None:
            await self.held.wait()
        if self.failures:
            raise self.failures.pop()
        if isinstance(patch, dict):
            self.endpoints = patch["endpoints"]
            return {}
        for operation in patch:  # a JSON patch: all or nothing
            if (
                operation["op"] == "test"
                and _at(self.endpoints, operation["path"]) != operation["value"]
            ):
                raise KubeError("the server rejected our request: test failed", TEST_FAILED)
        for operation in patch:
            if operation["op"] == "replace":
                assert operation["path"] == "/endpoints"
                self.endpoints = operation["value"]
        return {}

    def pods(self) -> list[str]:
        return [e["targetRef"]["name"] for e in self.endpoints]


def _at(endpoints: list[Obj], path: str) -> Any:
    """The value at a JSON pointer under /endpoints; None where there is none."""
    value: Any = {"endpoints": endpoints}
    for part in path.strip("/").split("/"):
        if isinstance(value, list):
            index = int(part)
            value = value[index] if index < len(value) else None
        elif isinstance(value, dict):
            value = value.get(part)
        if value is None:
            return None
    return value


class Gate:
    """The serving gate as LeaderRoute reads it."""

    def __init__(self) -> None:
        self.open = True

    def __call__(self) -> bool:
        return self.open


def route_of(api: Slice, pod: str, gate: Gate | None = None) -> LeaderRoute:
    return LeaderRoute(api, NAMESPACE, NAME, endpoint(pod), RETRY, gate or Gate())


@contextlib.asynccontextmanager
async def running(route: LeaderRoute) -> AsyncIterator[None]:
    task = asyncio.create_task(route.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def settled(api: Slice, expected: list[str]) -> None:
    async def there() -> bool:
        return api.pods() == expected

    await wait_until(there, 5, f"the EndpointSlice never came to rest on {expected}")
    await asyncio.sleep(RETRY * 4)  # and stays there: nothing left to undo it
    assert api.pods() == expected


@pytest.mark.parametrize("changes", [[True], [True, False], [True, False, True]])
async def test_a_change_during_a_write_in_flight_is_applied_after_it(changes: list[bool]) -> None:
    api = Slice("a")  # left from an earlier run of Pod a
    route = route_of(api, "a")
    api.held = asyncio.Event()
    async with running(route):
        # The first pass (emptying what an earlier run of this Pod left) is on its way...
        async def sent() -> bool:
            return api.arrived >= 1

        await wait_until(sent, 5, "the start-up write never went out")
        # ...when leadership comes (and maybe goes again).
        for leading in changes:
            route.want(leading)
        api.held.set()
        await settled(api, ["a"] if changes[-1] else [])


async def test_an_old_leader_never_writes_over_or_removes_the_new_leaders_endpoint() -> None:
    """a leads; its gate closes at the renew deadline while a is too starved to notice (no
    stand-by yet: it still wants to lead); b takes over. a neither re-asserts its endpoint
    nor, once it does notice, removes b's."""
    api = Slice()
    gate_a = Gate()
    a, b = route_of(api, "a", gate_a), route_of(api, "b")
    async with running(a), running(b):
        a.want(True)
        await settled(api, ["a"])
        gate_a.open = False
        b.want(True)
        await settled(api, ["b"])
        a.want(False)
        await settled(api, ["b"])
        await a.remove()  # shutdown of the old leader: still not b's endpoint it removes
        assert api.pods() == ["b"]
        b.want(False)
        await settled(api, [])


async def test_the_leader_restores_its_endpoint_when_it_is_changed() -> None:
    api = Slice()
    route = route_of(api, "a")
    async with running(route):
        route.want(True)
        await settled(api, ["a"])
        api.endpoints = []  # `helm upgrade` rendered it empty, or someone edited it
        await settled(api, ["a"])


async def test_a_failed_write_is_retried_until_it_succeeds() -> None:
    api = Slice()
    api.failures = [KubeError("connection refused")] * 3  # no answer: status 0, retried
    route = route_of(api, "a")
    async with running(route):
        route.want(True)
        await settled(api, ["a"])
    assert not api.failures


async def test_shutdown_right_after_leadership_ended_stops_the_loop() -> None:
    """At shutdown the gate closes (want(False)) and the loop is cancelled at once: the
    cancellation must end it, not be lost to the wake-up (it hung `serve` on SIGTERM)."""
    api = Slice()
    route = route_of(api, "a")
    task = asyncio.create_task(route.run())
    route.want(True)
    await settled(api, ["a"])
    route.want(False)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert task.cancelled()
