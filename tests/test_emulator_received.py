"""The emulator performs a create it received even if the client goes away, as a real API does
once the request arrived; it is counted in the statistics like any other."""

from __future__ import annotations

import httpx
import pytest
from fixtures.emulator import AUTH_HEADERS, RunningEmulator
from fixtures.stack import wait_until


@pytest.mark.parametrize("client_seconds", [0.05, 0.3])
async def test_create_is_performed_after_the_client_disconnects(
    emulator: RunningEmulator, client_seconds: float
) -> None:
    await emulator.admin.set_faults({"latency": {"create_server": {"fixed_ms": 600}}})
    body = {"name": "w1", "flavor": "flex-4-2", "image": "debian-12", "tags": {"k": "v"}}
    async with httpx.AsyncClient(base_url=emulator.url, headers=AUTH_HEADERS) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/servers", json=body, timeout=client_seconds)

    # The client and its connection are gone; the emulator still holds the request.
    async def idle() -> bool:
        return not any((await emulator.admin.in_flight()).values())

    await wait_until(idle, 10, "the emulator still handles the create")
    servers = await emulator.admin.servers()
    assert [(s["name"], s["tags"]) for s in servers] == [("w1", {"k": "v"})]
    assert (await emulator.admin.stats())["create_server"] == {"201": 1}
