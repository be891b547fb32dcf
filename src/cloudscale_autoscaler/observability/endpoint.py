"""The /metrics, /healthz, /readyz and /status HTTP endpoint (`metrics.listen`).

A module of its own so that aiohttp (~9 MB resident, bench/footprint.py) loads only when the
endpoint is configured: app.py imports it then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from cloudscale_autoscaler.observability.metrics import Metrics

log = logging.getLogger(__name__)


class HealthServer:
    """/metrics, /healthz (the process runs), /readyz (config loaded, cloud answered: it
    could serve CA if it led) and /status (the status view as JSON, status.py).
    `readiness` says whether it is ready and, as the body's text, what it is (e.g. "leader")
    or why it is not; `status` gives the status view's JSON document."""

    def __init__(
        self,
        metrics: Metrics,
        readiness: Callable[[], tuple[bool, str]],
        status: Callable[[], dict[str, Any]],
    ) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._status = status
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._serve_healthz)
        app.router.add_get("/readyz", self._serve_readyz)
        app.router.add_get("/status", self._serve_status)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        self.port = int(self._runner.addresses[0][1])  # the bound port, when `port` was 0
        log.info("metrics and health endpoint on http://%s:%d", host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve_metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _serve_healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _serve_readyz(self, _: web.Request) -> web.Response:
        ready, detail = self._readiness()
        if ready:
            return web.Response(text=f"ready: {detail}\n")
        return web.Response(status=503, text=f"not ready: {detail}\n")

    async def _serve_status(self, _: web.Request) -> web.Response:
        return web.json_response(self._status())
