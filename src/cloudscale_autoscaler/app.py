"""`cloudscale-autoscaler serve`: config -> provider (cloud, engine, service) -> gRPC server.

`build_provider` is the one place that constructs the object graph behind the gRPC service;
everything it starts is registered in `Provider.closers` and closed after the server stopped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from cloudscale_autoscaler.cloud.client import CloudscaleClient
from cloudscale_autoscaler.config import Config, ConfigError
from cloudscale_autoscaler.engine.engine import Engine
from cloudscale_autoscaler.logs import register_secret
from cloudscale_autoscaler.metrics import HealthServer, Metrics
from cloudscale_autoscaler.service.provider import CloudProviderService
from cloudscale_autoscaler.transport.interceptors import MetricsInterceptor
from cloudscale_autoscaler.transport.server import (
    DEFAULT_GRACE_SECONDS,
    ListenError,
    RunningServer,
    start_server,
)
from cloudscale_autoscaler.transport.tls import TLSFileError

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_STARTUP_FAILED = 1
EXIT_BAD_CONFIG = 2


@dataclass
class Provider:
    service: CloudProviderService
    metrics: Metrics
    # Awaited in reverse order after the server stopped (HTTP clients, background tasks).
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def aclose(self) -> None:
        for close in reversed(self.closers):
            try:
                await close()
            except Exception:
                log.exception("error while shutting down")


async def build_provider(config: Config) -> Provider:
    """Construct the service and everything behind it."""
    metrics = Metrics()
    client = CloudscaleClient.from_config(
        config.cloudscale, on_request=metrics.observe_cloud_request
    )
    engine = Engine(config, client)
    metrics.track_groups(engine.group_stats)
    metrics.last_refresh.set_function(lambda: engine.last_refresh_unix)
    provider = Provider(service=CloudProviderService(config, engine), metrics=metrics)
    # Closed in reverse: the engine lets creations already sent finish, then the client goes.
    provider.closers += [client.aclose, engine.aclose]
    await engine.start()
    return provider


@dataclass
class Running:
    """A started provider: the gRPC server and, if configured, the metrics endpoint."""

    provider: Provider
    server: RunningServer
    health: HealthServer | None

    @property
    def port(self) -> int:
        return self.server.port

    async def stop(self, grace: float = DEFAULT_GRACE_SECONDS) -> None:
        try:
            await self.server.stop(grace)
        finally:
            if self.health is not None:
                await self.health.stop()
            await self.provider.aclose()


async def start_provider(config: Config, *, listen: str | None = None) -> Running:
    """Build the provider and start serving it; raises TLSFileError, ListenError, ValueError."""
    provider = await build_provider(config)
    try:
        server = await start_server(
            config,
            provider.service,
            listen=listen,
            interceptors=[MetricsInterceptor(provider.metrics.observe_rpc)],
        )
    except BaseException:
        await provider.aclose()
        raise
    provider.metrics.tls_expiry.set_function(lambda: server.cert_not_after() or 0.0)
    health = None
    if config.metrics.listen is not None:
        engine = provider.service.engine
        health = HealthServer(provider.metrics, ready=lambda: engine.loaded)
        try:
            host, _, port = config.metrics.listen.rpartition(":")
            await health.start(host.strip("[]"), int(port))
        except BaseException:
            await Running(provider, server, None).stop(0)
            raise
    return Running(provider, server, health)


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def first_signal(signum: signal.Signals) -> None:
        log.info("received %s: shutting down", signum.name)
        stop.set()
        # A second signal takes the default action: exit now, without waiting for the grace.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, first_signal, sig)


async def run(
    config: Config,
    *,
    stop: asyncio.Event | None = None,
    grace: float = DEFAULT_GRACE_SECONDS,
) -> int:
    """Serve until `stop` is set (by default: until SIGTERM or SIGINT); returns an exit code."""
    if stop is None:
        stop = asyncio.Event()
        _on_signals(stop)
    try:
        running = await start_provider(config)
    except (TLSFileError, ListenError, ValueError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_STARTUP_FAILED
    await stop.wait()
    await running.stop(grace)
    return EXIT_OK


def serve_command(config_path: Path) -> int:
    from cloudscale_autoscaler.config_loader import load_config

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_CONFIG
    if config.cloudscale.token:
        register_secret(config.cloudscale.token)
    return asyncio.run(run(config))
