"""A serving provider's connection to its cluster: leader election, drift checks and Events.

The creation journal is a ConfigMap (kube/journal.py) whenever the namespace is known (the
Pod's, or leaderElection.namespace), with leader election or without: a Pod replaced by a
drain or a rollout finds it where its predecessor left it.

Without leader election the drift check runs from the start. With it, the replica holding the
Lease claims the creation journal and loads the inventory from the cloud (retrying, not
ready; after ABDICATE_AFTER failed loads it gives the Lease up so that a standby that can reach
the API takes over), then opens the serving gate, points the gRPC Service's EndpointSlice at
itself (kube/route.py) and starts the drift check; a replica that loses the Lease closes the
gate at once (the elector does), stops the drift check and drops creations it has not sent
yet (the journal tells the new leader about those it sent). Creates and journal writes are
fenced by the Lease (Elector.refusal): none is sent or written once it lapsed.
Events (kube/recorder.py) are written from the start; the recorder itself keeps a standby's
out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes import client as k8s

from cloudscale_autoscaler.config.kubernetes import outside_pod_error
from cloudscale_autoscaler.engine.engine import Engine
from cloudscale_autoscaler.engine.errors import CloudUnavailable
from cloudscale_autoscaler.kube.api import KubeApi, KubeConfigError, load_client, own_namespace
from cloudscale_autoscaler.kube.journal import ConfigMapStore
from cloudscale_autoscaler.kube.lease import Abdicate, Elector, default_identity
from cloudscale_autoscaler.kube.recorder import EventRecorder, own_pod
from cloudscale_autoscaler.kube.route import LeaderRoute, pod_endpoint
from cloudscale_autoscaler.kube.watch import DriftWatch
from cloudscale_autoscaler.observability.metrics import Metrics
from cloudscale_autoscaler.service.serving import Serving
from cloudscale_autoscaler.settings.types import Config, KubernetesConfig, LeaderElectionConfig

log = logging.getLogger(__name__)

_A = TypeVar("_A")
_R = TypeVar("_R")

# Failed inventory loads in a row after which a new leader gives the Lease up.
ABDICATE_AFTER = 3


def preflight(settings: KubernetesConfig) -> tuple[k8s.ApiClient, str | None]:
    """What serving needs from Kubernetes, checked before it listens (check-config runs it
    too): an API client, and the namespace of the Lease and the journal's ConfigMap (None
    without leader election outside a Pod: the journal is then a file). Raises
    KubeConfigError."""
    outside = outside_pod_error(settings, os.environ)
    if outside is not None:  # the same words as check-config's
        raise KubeConfigError(outside)
    client = load_client(settings.kubeconfig)
    election = settings.leader_election
    namespace = election.namespace or own_namespace()
    if namespace is None and election.enabled:
        raise KubeConfigError(
            "kubernetes.leaderElection.namespace: not set, and not running in a pod "
            "(no POD_NAMESPACE, no service account namespace file): set it"
        )
    return client, namespace


def _in_daemon_thread(function: Callable[[_A], _R], argument: _A) -> asyncio.Future[_R]:
    """`function(argument)` in a daemon thread; its result or exception in the future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_R] = loop.create_future()

    def settle(result: _R | None, error: BaseException | None) -> None:
        if future.done():
            return  # cancelled: nobody waits for it any more
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            outcome: tuple[_R | None, BaseException | None] = (function(argument), None)
        except BaseException as error:  # handed to the awaiting task, raised there
            outcome = (None, error)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="kube-preflight", daemon=True).start()
    return future


class ClusterLink:
    @classmethod
    async def connect(cls, config: Config, engine: Engine, metrics: Metrics) -> ClusterLink:
        """Preflight in a thread of its own: reading a kubeconfig may run an exec credential
        plugin, which must not hold up the event loop, nor the process's exit when start-up
        is abandoned (asyncio.run waits for its executor's threads, not for a daemon)."""
        if config.kubernetes is None:
            raise ValueError("ClusterLink needs the kubernetes section")
        client, namespace = await _in_daemon_thread(preflight, config.kubernetes)
        return cls(config, engine, metrics, KubeApi(client), namespace)

    def __init__(
        self,
        config: Config,
        engine: Engine,
        metrics: Metrics,
        api: KubeApi,
        namespace: str | None,
        clock: Callable[[], float] = time.monotonic,
        identity: str | None = None,
    ) -> None:
        """`api` over the client `preflight` returns, and its `namespace` (None when the
        journal is not a ConfigMap, and then without leader election); `clock` is the serving
        gate's and the Lease's (CLOCK_MONOTONIC, as the transport's); `identity` this
        replica's name in the Lease and the journal (default: the Pod's)."""
        settings = config.kubernetes
        if settings is None:
            raise ValueError("ClusterLink needs the kubernetes section")
        self._settings = settings
        self._engine = engine
        self._api = api
        self._drift_task: asyncio.Task[None] | None = None
        self._elector: Elector | None = None
        self._elector_task: asyncio.Task[None] | None = None
        self.route: LeaderRoute | None = None
        self._route_task: asyncio.Task[None] | None = None
        self.serving = Serving()
        election = settings.leader_election
        identity = identity or default_identity()
        if namespace is not None:
            journal = ConfigMapStore(
                self._api, namespace, election.journal_name, election.renew_deadline_seconds
            )
            log.info("creation journal: %s", journal.where)
            engine.use_journal(journal, identity)
        if namespace is not None and election.enabled:
            self.serving = Serving(f"{namespace}/{election.lease_name}", clock)
            self._elector = Elector(
                self._api,
                election,
                namespace,
                identity,
                self.serving,
                on_started=self._lead,
                on_stopped=self._stand_down,
                clock=clock,
            )
            engine.use_fence(self._elector.refusal)
            self.route = _leader_route(self._api, namespace, election, self.serving)
            if self.route is not None:
                self.serving.subscribe(self.route.want)
        self.events = EventRecorder(self._api, self.serving, own_pod())
        metrics.registry.register(self.events)
        engine.observer.subscribe(self.events)
        self._events_task: asyncio.Task[None] | None = None
        self.watch = DriftWatch(
            config, engine, self._api, settings.drift_tolerance, on_drift=self.events.drift
        )
        metrics.registry.register(self.watch)

    @property
    def elects(self) -> bool:
        return self._elector is not None

    @property
    def identity(self) -> str | None:
        """This replica's name in the Lease; None without leader election."""
        return None if self._elector is None else self._elector.identity

    def start(self) -> None:
        self._events_task = asyncio.create_task(self.events.run())
        if self._elector is not None:
            self._elector_task = asyncio.create_task(self._elector.run())
            if self.route is not None:
                self._route_task = asyncio.create_task(self.route.run())
        else:
            self._start_drift()

    async def _lead(self) -> None:
        """Before serving: the inventory as the cloud has it now, whatever the last leader
        did. Until a listing succeeds the gate stays closed (not ready), even for a replica
        that led before: its inventory is from then. Cancelled if the Lease is lost."""
        self._engine.forget_inventory()
        retry = self._settings.leader_election.retry_period_seconds
        for attempt in range(1, ABDICATE_AFTER + 1):
            try:
                await self._engine.load()
                break
            except (CloudUnavailable, TimeoutError) as error:
                why = str(error) or "timed out"
                log.warning(
                    "leader election: inventory load failed (%d of %d before the Lease is given "
                    "up), not serving: %s",
                    attempt,
                    ABDICATE_AFTER,
                    why,
                )
            if attempt == ABDICATE_AFTER:
                raise Abdicate(f"the inventory could not be loaded {ABDICATE_AFTER} times: {why}")
            await asyncio.sleep(retry)
        self._start_drift()

    def _stand_down(self) -> None:
        self._stop_drift()
        self._engine.drop_queued_creations("leadership lost")

    def reconfigure(self, config: Config) -> None:
        """A reloaded config (same kubernetes section): the drift check compares the new
        groups from its next round."""
        self.watch.reconfigure(config)

    def _start_drift(self) -> None:
        interval = self._settings.drift_interval_seconds
        if interval > 0 and self._drift_task is None:
            self._drift_task = asyncio.create_task(self.watch.run(interval))

    def _stop_drift(self) -> None:
        if self._drift_task is not None:
            self._drift_task.cancel()
            self._drift_task = None

    async def aclose(self) -> None:
        if self._elector_task is not None and self._elector is not None:
            self._elector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._elector_task
            # The Service stops routing here before a standby takes the released Lease.
            if self._route_task is not None and self.route is not None:
                self._route_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._route_task
                await self.route.remove()
            await self._elector.release()
        self._stop_drift()
        if self._events_task is not None:
            self._events_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._events_task
        await asyncio.to_thread(self._api.close)


def _leader_route(
    api: KubeApi, lease_namespace: str, election: LeaderElectionConfig, serving: Serving
) -> LeaderRoute | None:
    """The route to this replica's own Pod (POD_IP, POD_NAME, POD_UID and POD_NAMESPACE from
    the downward API; the namespace defaults to the Lease's); None without an EndpointSlice
    to write or outside a pod."""
    name = election.endpoint_slice
    if name is None:
        return None
    address, pod = os.environ.get("POD_IP"), os.environ.get("POD_NAME")
    if not address or not pod:
        log.error(
            "leader route: kubernetes.leaderElection.endpointSlice is %s but POD_IP or POD_NAME "
            "is not set (the downward API's status.podIP and metadata.name): the gRPC Service "
            "cannot reach this replica when it leads",
            name,
        )
        return None
    namespace = own_namespace() or lease_namespace
    endpoint = pod_endpoint(address, namespace, pod, os.environ.get("POD_UID", ""))
    retry = election.retry_period_seconds
    return LeaderRoute(api, namespace, name, endpoint, retry, lambda: serving.active)
