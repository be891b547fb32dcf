"""How refused creations reach CA, over mTLS gRPC against the emulator.

- A quota or capacity refusal stops its batch: creates not yet sent are not sent, they become
  placeholders with the same class and code, and one line summarises them.
- Resource refusals always reach CA as OutOfResources placeholders, however fast they come.
- Permanent refusals (unknown image, rejected token) fail IncreaseSize with a precise code and
  the API's own text, and roll the target back.
"""

from __future__ import annotations

import logging

import grpc
import pytest
from fixtures.stack import StackFactory, group, wait_until
from test_engine_e2e import increase, rpc_error

from cloudscale_autoscaler.engine.records import ERROR_CLASS_OUT_OF_RESOURCES


def _placeholders(instances: list) -> list[tuple[str, int]]:  # type: ignore[type-arg]
    return [
        (i.status.errorInfo.errorCode, i.status.errorInfo.instanceErrorClass)
        for i in instances
        if i.status.errorInfo.errorCode
    ]


async def test_quota_stops_the_batch(stack: StackFactory, caplog: pytest.LogCaptureFixture) -> None:
    s = await stack([group("workers", 0, 1000)], cloudscale={"max_concurrent_creates": 10})
    await s.admin.set_faults({"quota": {"max_servers": 20}})
    caplog.set_level(logging.INFO)
    caplog.clear()
    await increase(s, "workers", 1000)

    async def accounted() -> bool:
        await s.refresh()
        instances = await s.instances("workers")
        return len(instances) == 1000 and all(
            i.status.errorInfo.errorCode or i.id.startswith("cloudscale://") for i in instances
        )

    await wait_until(accounted, 60, "all 1000 accounted for")
    creates = sum((await s.admin.stats()).get("create_server", {}).values())
    assert creates <= 20 + 10, f"{creates} create calls"
    instances = await s.instances("workers")
    failed = _placeholders(instances)
    assert len(failed) == 1000 - len(await s.cloud_servers("workers"))
    assert set(failed) == {("QUOTA_EXCEEDED", ERROR_CLASS_OUT_OF_RESOURCES)}
    assert await s.target("workers") == 1000
    engine_lines = [
        r
        for r in caplog.records
        if r.name.startswith("cloudscale_autoscaler.engine") and r.levelno >= logging.WARNING
    ]
    assert len(engine_lines) <= 3, [r.getMessage() for r in engine_lines]
    assert any("not sent" in r.getMessage() for r in engine_lines)


@pytest.mark.parametrize(
    ("faults", "code"),
    [
        ({"zones_out_of_capacity": ["lpg1"]}, "ZONE_CAPACITY_EXHAUSTED"),
        ({"quota": {"max_servers": 0}}, "QUOTA_EXCEEDED"),
    ],
)
async def test_fast_resource_refusal_is_out_of_resources(
    stack: StackFactory, faults: dict[str, object], code: str
) -> None:
    # A generous wait: every refusal arrives within it, as with a fast API.
    s = await stack([group("workers", 0, 10)], increase_size_wait_seconds=10.0)
    await s.admin.set_faults(faults)
    await increase(s, "workers", 3)
    assert await s.target("workers") == 3
    assert _placeholders(await s.instances("workers")) == [(code, ERROR_CLASS_OUT_OF_RESOURCES)] * 3


async def test_unknown_image_fails_with_failed_precondition(stack: StackFactory) -> None:
    s = await stack(
        [group("workers", 0, 10, image="no-such-image")], increase_size_wait_seconds=10.0
    )
    error = await rpc_error(increase(s, "workers", 3))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "image: Object with slug=no-such-image does not exist." in (error.details() or "")
    assert await s.target("workers") == 0
    assert await s.instances("workers") == []


async def test_rejected_token_fails_with_permission_denied(stack: StackFactory) -> None:
    s = await stack([group("workers", 0, 10)], increase_size_wait_seconds=10.0)
    await s.admin.set_faults({"error_rate": {"create_server": {"rate": 1.0, "status": 403}}})
    error = await rpc_error(increase(s, "workers", 2))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
    assert "HTTP 403" in (error.details() or "")
    assert await s.target("workers") == 0
