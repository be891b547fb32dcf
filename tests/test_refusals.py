"""Which create refusals stop a batch, fail IncreaseSize, and with which code (pure table)."""

from __future__ import annotations

import pytest

from cloudscale_autoscaler.cloud.httperrors import error_for_status
from cloudscale_autoscaler.engine.errors import (
    CloudUnavailable,
    FailedPrecondition,
    PermissionDenied,
)
from cloudscale_autoscaler.engine.refusals import fails_the_rpc, rpc_error, stops_batch


@pytest.mark.parametrize(
    ("status", "message", "stops", "fails", "engine_error"),
    [
        (400, "Quota exceeded: servers (limit 1, in use 1).", True, False, CloudUnavailable),
        (400, "Insufficient capacity in zone rma1 for flavor x.", True, False, CloudUnavailable),
        (400, "image: Object with slug=x does not exist.", True, True, FailedPrecondition),
        (404, "Not found.", True, True, FailedPrecondition),
        (401, "Invalid token.", True, True, PermissionDenied),
        (403, "You do not have permission.", True, True, PermissionDenied),
        (429, "Request was throttled.", False, True, CloudUnavailable),
        (500, "A server error occurred.", False, True, CloudUnavailable),
        (503, "Service temporarily unavailable.", False, True, CloudUnavailable),
    ],
)
def test_refusal_table(
    status: int, message: str, stops: bool, fails: bool, engine_error: type
) -> None:
    error = error_for_status(status, message, "create_server")
    assert stops_batch(error) is stops
    assert fails_the_rpc(error) is fails
    assert type(rpc_error(error, "m")) is engine_error
