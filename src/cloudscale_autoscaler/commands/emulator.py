"""`cloudscale-autoscaler emulator`: the built-in cloudscale.ch API emulator
(cloud/emulator/) on a real port, until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from cloudscale_autoscaler.cloud.emulator.server import Emulator, parse_listen

log = logging.getLogger(__name__)


def emulator_command(listen: str, token: str | None, seed: int, boot_seconds: float) -> int:
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if boot_seconds < 0:
        log.error("--boot-seconds %s: expected a number >= 0", boot_seconds)
        return 2
    return asyncio.run(_serve(host, port, token, seed, boot_seconds))


async def _serve(host: str, port: int, token: str | None, seed: int, boot_seconds: float) -> int:
    emulator = Emulator(token=token, seed=seed, boot_seconds=boot_seconds)
    try:
        await emulator.start(host, port)
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", host, port, exc)
        return 1
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    log.info(
        "cloudscale.ch API emulator listening on %s (admin API %s, token %s, seed %d, boot %.1fs)",
        emulator.url,
        emulator.admin_url,
        "required" if token else "not checked",
        seed,
        boot_seconds,
    )
    try:
        await stopping.wait()
    finally:
        log.info("emulator stopping")
        await emulator.stop()
    return 0
