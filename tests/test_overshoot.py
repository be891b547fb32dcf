"""Another provider creating servers for our cluster (two replicas without leader election):
a group above its maxSize holding servers this provider did not create is named once per
episode, and its overshoot is a metric. The real server over mTLS, the emulator over HTTP."""

from __future__ import annotations

import logging

import pytest
from fixtures.stack import Stack, StackFactory, group, group_tags
from prometheus_client import generate_latest

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb

WARNING = "another provider may be creating servers for cluster test"
METRIC = 'cloudscale_autoscaler_node_group_servers_above_max_size{group="workers"}'


def above_max(s: Stack) -> float:
    text = generate_latest(s.provider.metrics.registry).decode()
    (line,) = [line for line in text.splitlines() if line.startswith(METRIC)]
    return float(line.split()[-1])


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]


async def test_servers_above_max_size_created_elsewhere_are_named_once(
    stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    s = await stack(groups=[group("workers", 0, 2)])
    # Ours, up to maxSize: no warning.
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    await s.settle("workers")
    await s.refresh()
    assert warnings(caplog) == [] and above_max(s) == 0

    # Another writer adds one: above maxSize, and not ours.
    await s.admin.create_server("test-workers-x", tags=group_tags("workers"))
    await s.refresh()
    (message,) = warnings(caplog)
    assert message.startswith("node group workers has 1 server(s) above its maxSize 2, and 1 ")
    assert above_max(s) == 1
    await s.refresh()
    assert len(warnings(caplog)) == 1, "once per episode, not every loop"

    # Back within maxSize (CA deletes one), then above again: a new episode.
    (extra,) = [x for x in await s.cloud_servers("workers") if x["name"] == "test-workers-x"]
    await s.admin.delete_server(extra["uuid"])
    await s.refresh()
    assert above_max(s) == 0
    await s.admin.create_server("test-workers-y", tags=group_tags("workers"))
    await s.refresh()
    assert len(warnings(caplog)) == 2
