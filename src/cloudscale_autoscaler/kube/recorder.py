"""The provider's Kubernetes Events: what the engine, the leader election and the drift check
report, aggregated (kube/events.py) and written by one background task.

- Recording never waits: it updates a tally and queues its key in one synchronous stretch on
  the loop. One task writes what is queued: woken by a record, it first lets FLUSH_SECONDS
  pass (a burst becomes one Event), then creates one Event per waiting key that is due (a key
  at most once per REPEAT_SECONDS), one at a time, each call bounded by
  WRITE_TIMEOUT_SECONDS: a slow or refusing API server delays the Events, never an RPC, and a
  storm costs one write per key. Events are only ever created (RBAC grants no `patch`).
- Only the serving replica records (the leader, with leader election): a standby has nothing
  to report, and two replicas must not tell the same story twice. Leadership changes are the
  exception: each replica reports its own, on its own Pod.
- A failed write is counted and logged once (until a write succeeds again), never raised;
  the Event's next occurrence writes its total.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.engine import refusals
from cloudscale_autoscaler.engine.status import RemovedGroup
from cloudscale_autoscaler.kube.api import KubeError, Obj, own_namespace
from cloudscale_autoscaler.kube.drift import GroupDrift, warning_line
from cloudscale_autoscaler.kube.events import (
    NORMAL,
    WARNING,
    Aggregator,
    Regarding,
    Write,
    event_name,
    new_event,
)
from cloudscale_autoscaler.kube.lease import default_identity
from cloudscale_autoscaler.observability.metrics import NAMESPACE
from cloudscale_autoscaler.service.serving import Serving

log = logging.getLogger(__name__)

CREATION_REFUSED = "CreationRefused"
DELETION_FAILED = "DeletionFailed"
LEADERSHIP_GAINED = "LeadershipGained"
LEADERSHIP_LOST = "LeadershipLost"
TEMPLATE_DRIFT = "TemplateDrift"
CONFIG_RELOAD_REFUSED = "ConfigReloadRefused"
NODE_GROUP_REMOVED = "NodeGroupRemoved"
WRITE_TIMEOUT_SECONDS = 5.0
FLUSH_SECONDS = 1.0


class EventApi(Protocol):
    async def create_event(self, namespace: str, body: Obj, limit: float) -> Obj: ...


def own_pod() -> Regarding | None:
    """This replica's Pod (POD_NAME, POD_NAMESPACE and POD_UID from the downward API), or None
    outside a pod."""
    name, namespace = os.environ.get("POD_NAME"), own_namespace()
    if not name or not namespace:
        return None
    return Regarding("Pod", name, namespace, os.environ.get("POD_UID", ""))


def refusal_message(group: str, error: CloudError) -> str | None:
    """The Event text of a failed creation, None unless the API refused it (quota, capacity,
    token, image, ...): transient failures are retried, CA's backoff and the logs cover them."""
    if not refusals.stops_batch(error):
        return None
    return f"node group {group}: the cloud API refused to create a server ({error.code}): {error}"


class EventRecorder(Collector):
    def __init__(
        self,
        api: EventApi,
        serving: Serving,
        pod: Regarding | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._serving = serving
        self._pod = pod
        self._instance = default_identity()
        self._clock = clock
        self._aggregator = Aggregator()
        self._wake = asyncio.Event()
        self._failing = False
        self.writes = {"ok": 0, "error": 0}
        if pod is None:
            log.info(
                "events: no POD_NAME (not in a pod): Events about this replica are not written"
            )
        serving.subscribe(self.leadership)

    # --- what happened --------------------------------------------------------------------

    def creation_failed(self, group: str, error: CloudError) -> None:
        message = refusal_message(group, error)
        if message is not None:
            self._record(self._pod, WARNING, CREATION_REFUSED, message)

    def deletion_failed(self, group: str, uuid: str, node: str, error: CloudError) -> None:
        """On the Node when CA named it, else on this replica's Pod."""
        regarding = Regarding("Node", node, uid=node) if node else self._pod
        message = f"node group {group}: deleting server {uuid} failed ({error.code}): {error}"
        self._record(regarding, WARNING, DELETION_FAILED, message, same=f"{group}/{uuid}")

    def drift(self, drift: GroupDrift) -> None:
        same = f"{drift.group}/{drift.field}"
        self._record(self._pod, WARNING, TEMPLATE_DRIFT, warning_line(drift), same=same)

    def config_refused(self, errors: list[str]) -> None:
        """A reload of the config file refused: on this replica's Pod, leader or not (each
        replica reloads its own mounted file)."""
        message = "config reload refused, the running configuration is kept: " + "; ".join(errors)
        self._record(self._pod, WARNING, CONFIG_RELOAD_REFUSED, message, always=True)

    def groups_removed(self, removed: Mapping[str, RemovedGroup]) -> None:
        """Node groups a reload removed; what they have is kept, unserved."""
        for name, left in removed.items():
            message = (
                f"node group {name} is no longer configured: {left.servers} server(s), "
                f"{left.creations_in_flight} create(s) sent before the reload and "
                f"{left.server_groups} managed server group(s) of it are kept and no longer "
                "served (a reload never deletes a server)"
            )
            self._record(self._pod, WARNING, NODE_GROUP_REMOVED, message, same=name, always=True)

    def leadership(self, serving: bool) -> None:
        """Called by the serving gate as it opens (True) or closes (False)."""
        lease = self._serving.lease
        if serving:
            message = f"{self._instance} leads (Lease {lease}) and serves the CloudProvider RPCs"
            reason, type_ = LEADERSHIP_GAINED, NORMAL
        else:
            why = self._serving.refusal() or "standby now"
            message = f"{self._instance} stopped serving the CloudProvider RPCs: {why}"
            reason, type_ = LEADERSHIP_LOST, WARNING
        self._record(self._pod, type_, reason, message, same=reason, always=True)

    def _record(
        self,
        regarding: Regarding | None,
        type_: str,
        reason: str,
        message: str,
        same: str | None = None,
        *,
        always: bool = False,
    ) -> None:
        if regarding is None or not (always or self._serving.active):
            return
        self._aggregator.record(regarding, type_, reason, message, self._clock(), same)
        self._wake.set()

    # --- writing --------------------------------------------------------------------------

    async def run(self) -> None:
        """Write what is due, round after round, until cancelled."""
        while True:
            # A key waiting for its REPEAT_SECONDS wakes the writer too.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._aggregator.next_due(self._clock())):
                    await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(FLUSH_SECONDS)
            while (write := self._aggregator.take(self._clock())) is not None:
                await self._write(write)

    async def _write(self, write: Write) -> None:
        event = write.event
        namespace = event.regarding.event_namespace
        body = new_event(event, event_name(event.regarding), self._instance)
        try:
            await self._api.create_event(namespace, body, WRITE_TIMEOUT_SECONDS)
        except KubeError as exc:
            self._aggregator.failed(write)
            self._failed(write, exc)
            return
        self._aggregator.written(write, self._clock())
        self.writes["ok"] += 1
        if self._failing:
            log.info("events: writing Events works again")
            self._failing = False

    def _failed(self, write: Write, error: KubeError) -> None:
        self.writes["error"] += 1
        if not self._failing:
            event = write.event
            log.warning(
                "events: writing Event %s about %s %s failed (not logged again until a write "
                "succeeds; its next occurrence writes the total): %s",
                event.reason,
                event.regarding.kind,
                event.regarding.name,
                error,
            )
            self._failing = True

    # --- metrics --------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        writes = CounterMetricFamily(
            f"{NAMESPACE}_kube_event_writes",
            "Kubernetes Event creations and updates sent, by result (ok, error).",
            labels=["result"],
        )
        for result, count in self.writes.items():
            writes.add_metric([result], float(count))
        dropped = CounterMetricFamily(
            f"{NAMESPACE}_kube_events_dropped",
            "Kubernetes Event writes dropped unsent because the queue was full.",
        )
        dropped.add_metric([], float(self._aggregator.dropped))
        yield from (writes, dropped)
