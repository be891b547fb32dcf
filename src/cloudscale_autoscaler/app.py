"""The provider assembled and run: config -> provider (cloud, engine, service) -> gRPC server.

`build_provider` is the one place that constructs the object graph behind the gRPC service;
everything it starts is registered in `Provider.closers` and closed after the server stopped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cloudscale_autoscaler.cloud.client import CloudscaleClient
from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.config.advice import config_warnings
from cloudscale_autoscaler.engine.catalogue_check import online_problems
from cloudscale_autoscaler.engine.engine import Engine
from cloudscale_autoscaler.engine.status import RemovedGroup
from cloudscale_autoscaler.journal.file import FILE_NAME, FileStore, default_directory
from cloudscale_autoscaler.observability.metrics import Metrics
from cloudscale_autoscaler.reload.reloader import Apply, ConfigFile, Reloader
from cloudscale_autoscaler.service.gate import GatedService, gated
from cloudscale_autoscaler.service.hot import HotAnswers
from cloudscale_autoscaler.service.provider import SERVICE_NAME, CloudProviderService
from cloudscale_autoscaler.service.serving import Serving
from cloudscale_autoscaler.settings.types import Config
from cloudscale_autoscaler.status import Status, collect, leader_status
from cloudscale_autoscaler.transport.server import (
    DEFAULT_GRACE_SECONDS,
    ListenError,
    RunningServer,
    start_server,
)
from cloudscale_autoscaler.transport.tls import TLSFileError

if TYPE_CHECKING:
    from cloudscale_autoscaler.kube.link import ClusterLink
    from cloudscale_autoscaler.observability.endpoint import HealthServer

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_STARTUP_FAILED = 1


@dataclass
class Provider:
    service: CloudProviderService
    metrics: Metrics
    # Whether this replica answers CA (always, unless leader election makes it a standby).
    serving: Serving = field(default_factory=Serving)
    # The Kubernetes side (drift checks, leader election), with the `kubernetes:` section.
    link: ClusterLink | None = None
    # Whether the cloud API answered the start-up check (a standby's readiness).
    cloud_answered: bool = False
    # Awaited in reverse order after the server stopped (HTTP clients, background tasks).
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def aclose(self) -> None:
        for close in reversed(self.closers):
            try:
                await close()
            except Exception:
                log.exception("error while shutting down")


# Makes the Kubernetes side of a provider (default: ClusterLink.connect, which reads the
# kubeconfig or the in-cluster account; the fault campaign passes an in-memory API).
LinkFactory = Callable[[Config, Engine, Metrics], Awaitable["ClusterLink"]]


async def build_provider(
    config: Config,
    *,
    clock: Callable[[], float] = time.monotonic,
    link: LinkFactory | None = None,
) -> Provider:
    """Construct the service and everything behind it; `clock` is the engine's (and should
    be the link's)."""
    metrics = Metrics()
    client = CloudscaleClient.from_config(
        config.cloudscale, on_request=metrics.observe_cloud_request
    )
    engine = Engine(config, client, clock=clock)
    metrics.track_groups(engine.group_stats)
    metrics.track_removed(engine.removed_groups)
    metrics.last_refresh.set_function(lambda: engine.last_refresh_unix)
    provider = Provider(service=CloudProviderService(config, engine), metrics=metrics)
    # Read at scrape time: _connect replaces provider.serving with the Lease's gate.
    metrics.leader.set_function(lambda: float(provider.serving.active))
    # Closed in reverse: the engine lets creations already sent finish, then the client goes.
    provider.closers += [client.aclose, engine.aclose]
    for warning in config_warnings(config):
        log.warning("config: %s", warning)
    # In the background: a slow API must not delay serving. Same check as check-config --online.
    check = asyncio.create_task(_check_catalogue(config, client, provider))
    provider.closers.append(lambda: _cancel(check))
    try:
        await _connect(provider, config, engine, link)
    except BaseException:  # a failure, or a signal abandoning start-up (cancellation)
        await provider.aclose()
        raise
    return provider


async def _connect(
    provider: Provider, config: Config, engine: Engine, make_link: LinkFactory | None
) -> None:
    """The Kubernetes side, if configured, and the first inventory load; each may wait."""
    link = None
    if config.kubernetes is not None:
        if make_link is None:
            # Imported only here: without the section nothing loads the kubernetes package.
            from cloudscale_autoscaler.kube.link import ClusterLink

            make_link = ClusterLink.connect
        link = await make_link(config, engine, provider.metrics)
        provider.link, provider.serving = link, link.serving
        provider.closers.append(link.aclose)  # registered last, closed first: releases the Lease
    if not engine.has_journal:
        _use_file_journal(engine, config)
    if link is None or not link.elects:
        await engine.start()  # with leader election, the Lease holder loads it on takeover
    if link is not None:
        link.start()


def _use_file_journal(engine: Engine, config: Config) -> None:
    """The creation journal in a file: under stateDir, else in the default place."""
    if config.state_dir is not None:
        directory, why = config.state_dir, "stateDir"
    else:
        directory, why = default_directory(os.environ)
    log.info("creation journal: file %s (%s)", directory / FILE_NAME, why)
    engine.use_journal(FileStore(directory), f"pid {os.getpid()} on {socket.gethostname()}")


# Between attempts of the start-up check while the API does not answer.
CATALOGUE_RETRY_SECONDS = 10.0


async def _check_catalogue(config: Config, cloud: Cloud, provider: Provider) -> None:
    """The config's names against the API, retried until the API answers: that answer is
    what makes a standby ready."""
    failures = 0
    while True:
        try:
            problems = await online_problems(config.node_groups, cloud)
            break
        except CloudError as error:
            if not failures:  # once: the API's health has its own metrics and Refresh errors
                log.warning(
                    "could not check the config's names against the API (retrying every %gs): %s",
                    CATALOGUE_RETRY_SECONDS,
                    error,
                )
        except Exception:  # a bug must not leave a standby unready for ever, unsaid
            if not failures:
                log.exception(
                    "checking the config's names against the API failed (retrying every %gs)",
                    CATALOGUE_RETRY_SECONDS,
                )
        failures += 1
        await asyncio.sleep(CATALOGUE_RETRY_SECONDS)
    provider.cloud_answered = True
    for problem in problems:
        log.warning("config: %s: creating servers in this node group will fail", problem)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _elects(provider: Provider) -> bool:
    return provider.link is not None and provider.link.elects


def servicer_of(provider: Provider) -> CloudProviderService | GatedService:
    """What the transport serves: the service, behind the serving gate when replicas elect."""
    return gated(provider.service, provider.serving) if _elects(provider) else provider.service


# With leader election, client connections are closed (GOAWAY, in-flight calls finish) after
# this age, so CA, which otherwise keeps one connection for its lifetime, reconnects through
# the Service to whichever replica is ready: a leader that lost the Lease but lives on is
# left within it.
MAX_CONNECTION_AGE_SECONDS = 30.0


def _follow_serving(serving: Serving, server: RunningServer) -> None:
    """The CloudProvider entry of gRPC health follows the gate ("" stays SERVING: a standby
    is healthy)."""

    def update(active: bool) -> None:
        server.set_health(SERVICE_NAME, active)

    serving.subscribe(update)
    update(serving.active)


def _follow_deadline(serving: Serving, server: RunningServer, hot: HotAnswers) -> None:
    """The transport answers by itself only while the gate is open: each Lease renewal moves
    its deadline. A gate that opens does so after the answers are published (a takeover has
    just loaded the inventory); one that closes, before."""

    def follow(until: float) -> None:
        if not serving.active:
            server.serve_until(until)
        hot.publish()
        server.serve_until(until)

    serving.follow_deadline(follow)
    follow(serving.until)


def _readiness(provider: Provider) -> tuple[bool, str]:
    """Ready once this replica could serve CA if it led: the config is loaded (it runs) and
    the cloud API answered. With leader election a standby is ready too (rollouts, drains
    and `helm install --wait` need both replicas Ready); the gRPC Service routes CA by the
    leader's EndpointSlice instead (kube/route.py)."""
    answered = provider.service.engine.loaded
    if not _elects(provider):
        return (True, "serving") if answered else (False, NOT_ANSWERED)
    if not (answered or provider.cloud_answered):
        return False, NOT_ANSWERED
    refusal = provider.serving.refusal()
    return True, "leader" if refusal is None else refusal


NOT_ANSWERED = "the cloud API has not answered yet"


@dataclass
class Running:
    """A started provider: the gRPC server and, if configured, the metrics endpoint and the
    reloading of its config file."""

    provider: Provider
    server: RunningServer
    health: HealthServer | None
    hot: HotAnswers
    reloader: Reloader | None = None
    _reloading: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self.server.port

    def reconfigure(self, config: Config) -> dict[str, RemovedGroup]:
        """Serve a reloaded config (see `reconfigure`), the transport's answers included."""
        return reconfigure(self.provider, config, self.hot.reconfigured)

    async def stop(self, grace: float = DEFAULT_GRACE_SECONDS) -> None:
        if self._reloading is not None:  # no reload while the server drains
            await _cancel(self._reloading)
        try:
            await self.server.stop(grace)
        finally:
            if self.health is not None:
                await self.health.stop()
            await self.provider.aclose()


def reconfigure(
    provider: Provider, config: Config, republish: Callable[[], None]
) -> dict[str, RemovedGroup]:
    """Serve a reloaded config (validated): the service and engine, what the transport
    answers by itself (`republish`) and the drift check, in one synchronous stretch; whole or
    not at all (on a failure the running config is put back the same way, and the error
    raised). Then the removed groups send nothing more; what each still has is returned (and
    reported)."""
    running = provider.service.engine.config
    try:
        names = _serve(provider, config, republish)
    except Exception:
        _serve(provider, running, republish)
        raise
    removed = provider.service.engine.stop_removed(names)
    _report_removed(provider, removed)
    return removed


def _serve(provider: Provider, config: Config, republish: Callable[[], None]) -> list[str]:
    removed = provider.service.reconfigure(config)
    republish()
    if provider.link is not None:
        provider.link.reconfigure(config)
    return removed


def reload_apply(provider: Provider, republish: Callable[[], None]) -> Apply:
    """The reloader's `apply`: `reconfigure`, then the new templates built (best effort: they
    are built on demand too)."""

    async def apply(config: Config) -> None:
        reconfigure(provider, config, republish)
        try:
            await provider.service.engine.warm_templates()
        except Exception:
            log.exception("config reload: building the new templates failed")

    return apply


async def start_provider(
    config: Config, *, listen: str | None = None, source: ConfigFile | None = None
) -> Running:
    """Build the provider and start serving it; with `source` (the file `config` came from),
    reload that file when it changes (reload/). Raises TLSFileError, ListenError,
    ValueError."""
    provider = await build_provider(config)
    try:
        server = await start_server(
            config,
            servicer_of(provider),
            listen=listen,
            max_connection_age=MAX_CONNECTION_AGE_SECONDS if _elects(provider) else None,
            gated=_elects(provider),
        )
    except BaseException:
        await provider.aclose()
        raise
    provider.metrics.track_rpcs(server.rpc_readings)
    hot = HotAnswers(provider.service, server)
    hot.publish()
    server.set_after_call(hot.publish)
    provider.service.engine.on_change = hot.publish
    if _elects(provider):
        _follow_deadline(provider.serving, server, hot)
        _follow_serving(provider.serving, server)
    provider.metrics.tls_expiry.set_function(lambda: server.cert_not_after() or 0.0)
    running = Running(provider, server, None, hot)
    if source is not None:
        _reload_from(source, running)
    if config.metrics.listen is not None:
        # Imported only here: without the endpoint nothing loads aiohttp.
        from cloudscale_autoscaler.observability.endpoint import HealthServer

        health = HealthServer(
            provider.metrics,
            readiness=lambda: _readiness(provider),
            status=lambda: status_of(running).to_json(),
        )
        try:
            host, _, port = config.metrics.listen.rpartition(":")
            await health.start(host.strip("[]"), int(port))
        except BaseException:
            await running.stop(0)
            raise
        running.health = health
    return running


def _reload_from(source: ConfigFile, running: Running) -> None:
    """Reload `source` while serving: checked like `check-config --online`, applied to the
    service and engine, the transport's answers and the drift check (reload/)."""
    provider = running.provider
    engine = provider.service.engine

    async def online_check(config: Config) -> list[str]:
        return await online_problems(config.node_groups, engine.cloud)

    apply = reload_apply(provider, running.hot.reconfigured)
    reloader = Reloader(source, engine.config, online_check, apply)
    metrics = provider.metrics
    metrics.config_reload_success.set_function(lambda: float(reloader.status.ok is not False))
    metrics.config_loaded.set_function(lambda: reloader.status.loaded_unix)
    metrics.track_reloads(lambda: reloader.counts)
    if provider.link is not None:
        reloader.on_refused.append(provider.link.events.config_refused)
    running.reloader = reloader
    running._reloading = asyncio.create_task(reloader.run())


def _report_removed(provider: Provider, removed: dict[str, RemovedGroup]) -> None:
    """A log line and an Event per group a reload removed, saying what it still has."""
    for name, left in removed.items():
        log.warning(
            "config reload: node group %s is no longer configured: not served any more, and "
            "what it has is kept (a reload never deletes a server): %d server(s), %d create(s) "
            "sent before the reload, %d managed server group(s); delete them yourself, or "
            "configure the group again (/status unconfigured_groups lists them until gone)",
            name,
            left.servers,
            left.creations_in_flight,
            left.server_groups,
        )
    if removed and provider.link is not None:
        provider.link.events.groups_removed(removed)


def status_of(running: Running) -> Status:
    """The status view of a started provider (GET /status)."""
    provider, server = running.provider, running.server
    engine = provider.service.engine
    identity = provider.link.identity if provider.link is not None else None
    return collect(
        engine.group_statuses(),
        provider.service.seen,
        engine.last_refresh,
        engine.last_refresh_unix,
        leader_status(provider.serving, identity),
        server.cert_not_after(),
        server.rpc_readings(),
        running.reloader.status if running.reloader is not None else None,
        engine.removed_groups(),
    )


def _on_signals(
    stop: asyncio.Event, reload: Callable[[], None], stopping: Callable[[], None]
) -> None:
    """SIGTERM and SIGINT call `stopping` at once and stop; SIGHUP calls `reload` (from the
    start: its default action would end the process)."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reload)

    def first_signal(signum: signal.Signals) -> None:
        log.info("received %s: shutting down", signum.name)
        stopping()
        stop.set()
        # A second signal takes the default action: exit now, without waiting for the grace.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, first_signal, sig)


async def run(
    config: Config,
    *,
    source: ConfigFile | None = None,
    stop: asyncio.Event | None = None,
    grace: float = DEFAULT_GRACE_SECONDS,
) -> int:
    """Serve until `stop` is set (by default: until SIGTERM or SIGINT; then SIGHUP reloads
    `source`, the file `config` came from); returns an exit code."""
    started: list[Running] = []
    if stop is None:
        stop = asyncio.Event()
        _on_signals(stop, lambda: _reload_now(started), lambda: _refuse_creations(started))
    try:
        running = await _start_unless_stopped(config, stop, source)
    except (TLSFileError, ListenError, ValueError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_STARTUP_FAILED
    if running is None:
        log.error("stopped before start-up completed")
        return EXIT_STARTUP_FAILED
    started.append(running)
    await stop.wait()
    await running.stop(grace)
    return EXIT_OK


def _refuse_creations(started: list[Running]) -> None:
    """No creation starts once a stop signal arrived: the server stops listening only when
    run() wakes, and a call taken in before that (CI saw one a millisecond after SIGTERM)
    would otherwise create a server the shutdown then waits for."""
    if started:
        started[0].provider.service.engine.refuse_creations()


def _reload_now(started: list[Running]) -> None:
    reloader = started[0].reloader if started else None
    if reloader is None:
        log.info("received SIGHUP: no config file to reload (not serving one yet)")
        return
    reloader.request()


async def _start_unless_stopped(
    config: Config, stop: asyncio.Event, source: ConfigFile | None
) -> Running | None:
    """The started provider, or None when `stop` came first: start-up can wait long (an exec
    credential plugin, a slow DNS), and a signal then must not wait for it."""
    starting = asyncio.create_task(start_provider(config, source=source))
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait((starting, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when run() itself is cancelled
        stopped.cancel()
        if not starting.done():
            starting.cancel()  # start_provider closes what it had started
    try:
        return await starting
    except asyncio.CancelledError:
        return None
