"""A stopped provider leaves nothing alive in its process.

One process starts and stops providers many times: the fault campaign starts one per example
and per restart. The compiled transport holds Python's callbacks (bound methods of the
objects that hold it): kept after the stop, they made a cycle through an object Python's
garbage collector cannot look into, and each stopped provider stayed in memory whole (its
server, engine, inventory, metrics registry and HTTP client: the long campaign grew by about
300 MB a minute). The transport lets go of them once stopped.
"""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any

from fixtures.emulator import RunningEmulator
from fixtures.stack import group, stack_config
from fixtures.tls import PKI, grpc_channel

from cloudscale_autoscaler.app import start_provider
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc

TIMEOUT = 10.0


def transport_threads() -> int:
    """The compiled transport's serving threads alive in this process."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += comm.read().strip() == "grpc-transport"
        except FileNotFoundError:  # ended meanwhile
            pass
    return count


async def start_call_stop(emulator: RunningEmulator, pki: PKI) -> dict[str, weakref.ref[Any]]:
    """Start a provider, call it as CA does (a forwarded call, a hot answer), stop it; weak
    references to what it was made of."""
    running = await start_provider(stack_config(emulator, pki, [group("workers", 0, 3)]))
    channel = grpc_channel(pki, f"127.0.0.1:{running.port}")
    try:
        stub = pb_grpc.CloudProviderStub(channel)  # type: ignore[no-untyped-call]
        await stub.Refresh(pb.RefreshRequest(), timeout=TIMEOUT)
        groups = await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT)
        assert [g.id for g in groups.nodeGroups] == ["workers"]
    finally:
        await channel.close(None)
        await running.stop(0)
    provider = running.provider
    engine = provider.service.engine
    return {
        "Running": weakref.ref(running),
        "RunningServer": weakref.ref(running.server),
        "Calls": weakref.ref(running.server._calls),
        "HotAnswers": weakref.ref(running.hot),
        "Provider": weakref.ref(provider),
        "CloudProviderService": weakref.ref(provider.service),
        "Engine": weakref.ref(engine),
        "CloudscaleClient": weakref.ref(engine.cloud),
        "CollectorRegistry": weakref.ref(provider.metrics.registry),
    }


async def test_a_stopped_provider_leaves_nothing_alive(emulator: RunningEmulator, pki: PKI) -> None:
    threads = transport_threads()
    gone = await start_call_stop(emulator, pki)
    gc.collect()  # the provider's own objects refer to each other: a cycle is the collector's
    alive = sorted(name for name, ref in gone.items() if ref() is not None)
    assert alive == [], f"still alive after the stop: {alive}"
    assert transport_threads() == threads
