"""The emulator's aiohttp application and the in-process `Emulator` (run on its own by the
`emulator` command, commands/emulator.py)."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from aiohttp import web

from cloudscale_autoscaler.cloud.emulator import admin, api
from cloudscale_autoscaler.cloud.emulator.responses import Handler, converted
from cloudscale_autoscaler.cloud.emulator.state import EmulatorState

log = logging.getLogger(__name__)

# Large enough for any create body with user data; bigger bodies get a DRF-shaped 413.
MAX_BODY_BYTES = 1024 * 1024
# Requests still sleeping in an injected latency must not hold up stop() for long.
SHUTDOWN_TIMEOUT_SECONDS = 1.0


@web.middleware
async def _middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if api.is_api_path(request.path):
        return await api.handle_api_request(request, handler)
    return await converted(request, handler)


def build_app(state: EmulatorState, token: str | None) -> web.Application:
    app = web.Application(middlewares=[_middleware], client_max_size=MAX_BODY_BYTES)
    app[api.STATE] = state
    if token is not None:
        app[api.TOKEN] = token
    api.add_routes(app)
    admin.add_routes(app)
    return app


class Emulator:
    """An emulated cloudscale.ch API on a local port.

    `token=None` accepts any request; `seed` seeds every random decision (faults, uuids);
    `boot_seconds` is how long a new server stays "changing" before it is "running".
    """

    def __init__(self, token: str | None = None, seed: int = 0, boot_seconds: float = 0.0) -> None:
        self.token = token
        self.state = EmulatorState(seed=seed, boot_seconds=boot_seconds)
        self._runner: web.AppRunner | None = None
        self._origin: str | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if self._runner is not None:
            raise RuntimeError("emulator already started")
        runner = web.AppRunner(
            build_app(self.state, self.token),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self._origin = f"http://{shown}:{bound_port}"
        self.state.base = self.url

    @property
    def url(self) -> str:
        """The API base URL, e.g. http://127.0.0.1:PORT/v1."""
        return f"{self._started_origin()}/v1"

    @property
    def admin_url(self) -> str:
        return f"{self._started_origin()}{admin.PREFIX}"

    def _started_origin(self) -> str:
        if self._origin is None:
            raise RuntimeError("emulator not started")
        return self._origin

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        self._origin = None
        if runner is not None:
            await runner.cleanup()
        carried = list(self.state.carried)
        for task in carried:
            task.cancel()
        await asyncio.gather(*carried, return_exceptions=True)

    async def __aenter__(self) -> Emulator:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def parse_listen(listen: str) -> tuple[str, int]:
    """ "HOST:PORT" or "[V6]:PORT" -> (host, port)."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT with a port 0-65535")
    host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
    return host, int(port_text)
