"""Leader election over a coordination.k8s.io/v1 Lease, with client-go's rules.

- A replica takes the Lease when it does not exist (create), when it has no holder, or when
  the holder has not renewed it for leaseDuration. "Not renewed" is judged on this replica's
  own clock, from when it last saw the record change, never by comparing the record's
  timestamps with local time: clocks of two nodes need not agree.
- Every write is a replace carrying the resourceVersion read just before, so of two replicas
  racing for an expired Lease exactly one wins (the other gets 409 Conflict).
- The leader renews every retryPeriod. If it sees another replica holding the Lease, or no
  renewal succeeds for renewDeadline, it stops serving at once and becomes a standby;
  renewDeadline < leaseDuration, so it has stopped before any standby may take over. The
  serving gate also closes by itself at that deadline, in case this process is too starved
  to notice.
- On shutdown the leader releases the Lease (empty holder), so a standby takes over within one
  retryPeriod instead of waiting for the Lease to expire.
- A leader that cannot prepare to serve (`on_started` raises Abdicate: its inventory could not
  be loaded) releases the Lease and sits out one leaseDuration, so a standby that can takes
  over; alone, it takes the Lease again after that.
- `refusal` is the fence for what only the Lease holder may do (send creates, write the
  creation journal): None while this replica holds the Lease and its last renewal is within the
  renew deadline, which is shorter than the leaseDuration a standby waits before it takes over.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from cloudscale_autoscaler.kube.api import KubeError, Obj
from cloudscale_autoscaler.service.serving import Serving
from cloudscale_autoscaler.settings.types import LeaderElectionConfig

log = logging.getLogger(__name__)

API_VERSION = "coordination.k8s.io/v1"
# client-go's JitterFactor bound: a retry waits retryPeriod plus up to this share of it.
JITTER = 0.2
# No renewal is tried with less time left than this: no API server answers that fast, and on a
# clock of whole ticks (a virtual one) a remainder below one tick would be retried for ever
# without the clock ever moving.
MIN_ATTEMPT_SECONDS = 0.001


class LeaseApi(Protocol):
    async def get_lease(self, namespace: str, name: str, limit: float) -> Obj | None: ...

    async def create_lease(self, namespace: str, body: Obj, limit: float) -> Obj: ...

    async def replace_lease(self, namespace: str, name: str, body: Obj, limit: float) -> Obj: ...


class Abdicate(Exception):
    """Raised by `on_started`: this replica cannot serve as leader; the message says why."""


def default_identity() -> str:
    """The pod name (POD_NAME, from the downward API), else host name and process id."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def micro_time() -> str:
    """Now as a metav1.MicroTime."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(
        self,
        api: LeaseApi,
        settings: LeaderElectionConfig,
        namespace: str,
        identity: str,
        serving: Serving,
        on_started: Callable[[], Awaitable[None]],
        on_stopped: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._settings = settings
        self.namespace = namespace
        self.identity = identity
        self._serving = serving
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._clock = clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = -math.inf
        self._lease: Obj | None = None  # the Lease as last read or written
        self._renewed_at = -math.inf  # when the last successful write was started
        self._failure: str | None = None  # the last failed attempt's reason, logged once
        self.leading = False

    @property
    def name(self) -> str:
        return self._settings.lease_name

    def refusal(self) -> str | None:
        """None while this replica holds the Lease (renewed within the renew deadline), else
        why not: the fence for creates and the creation journal."""
        if self.leading and self._clock() < self._deadline():
            return None
        return f"this replica ({self.identity}) does not hold Lease {self._serving.lease} now"

    # --- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Compete for the Lease and lead while holding it, until cancelled."""
        log.info(
            "leader election: %s competes for Lease %s/%s", self.identity, self.namespace, self.name
        )
        while True:
            await self._acquire()
            if await self._lead():
                continue
            await self.release()  # abdicated: a standby may take it at once
            await asyncio.sleep(self._settings.lease_duration_seconds)

    async def _acquire(self) -> None:
        retry = self._settings.retry_period_seconds
        while True:
            if await self._attempt(retry):
                return
            await asyncio.sleep(retry * (1 + JITTER * random.random()))

    async def _lead(self) -> bool:
        """Lead until the Lease is lost (True) or this replica abdicates (False)."""
        log.info("leader election: %s acquired Lease %s", self.identity, self._serving.lease)
        self.leading = True
        started = asyncio.create_task(self._start())
        try:
            while await self._renew():
                if started.done():
                    if not started.result():
                        return False
                    self._serving.serve_until(self._deadline())
            return True
        finally:
            self.leading = False
            started.cancel()
            self._serving.stand_by(self._holder_seen())
            self._on_stopped()

    async def _start(self) -> bool:
        """Prepare to serve, then open the gate; False when `on_started` abdicated."""
        try:
            await self._on_started()
        except Abdicate as why:
            log.error(
                "leader election: %s gives Lease %s up for %gs, so that a standby may take "
                "over: %s",
                self.identity,
                self._serving.lease,
                self._settings.lease_duration_seconds,
                why,
            )
            return False
        except Exception:  # the engine loads the inventory again on demand
            log.exception("leader election: preparing to serve failed; serving anyway")
        self._serving.serve_until(self._deadline())
        return True

    def _deadline(self) -> float:
        return self._renewed_at + self._settings.renew_deadline_seconds

    async def _renew(self) -> bool:
        """Sleep one retryPeriod, then renew, retrying until the renew deadline."""
        retry = self._settings.retry_period_seconds
        await asyncio.sleep(retry)
        deadline = self._deadline()
        while (remaining := deadline - self._clock()) >= MIN_ATTEMPT_SECONDS:
            try:  # asyncio.timeout: 3.11's wait_for can swallow the cancel of a shutdown
                async with asyncio.timeout(remaining):
                    won = await self._attempt(remaining)
            except TimeoutError:
                break
            if won:
                return True
            holder = self._holder_seen()
            if holder is not None:  # another replica holds the Lease: no retry can win it back
                log.error(
                    "leader election: %s lost Lease %s to %s: stopping serving",
                    self.identity,
                    self._serving.lease,
                    holder,
                )
                return False
            await asyncio.sleep(min(retry, max(0.0, deadline - self._clock())))
        log.error(
            "leader election: %s could not renew Lease %s within %gs: stopping serving",
            self.identity,
            self._serving.lease,
            self._settings.renew_deadline_seconds,
        )
        return False

    # --- one attempt ----------------------------------------------------------------------

    async def _attempt(self, limit: float) -> bool:
        """Create, take or renew the Lease; False when another replica holds it or we lost a
        race. API errors count as a failed attempt (logged), never as an exception."""
        started = self._clock()
        try:
            won = await self._try(limit)
        except KubeError as exc:
            # Each reason once while it lasts: a missing Lease is retried every retryPeriod.
            if exc.status != 409 and str(exc) != self._failure:
                log.warning("leader election: Lease %s: %s", self._serving.lease, exc)
                self._failure = str(exc)
            return False
        self._failure = None
        if won:
            self._renewed_at = started
        return won

    async def _try(self, limit: float) -> bool:
        now = micro_time()
        lease = await self._api.get_lease(self.namespace, self.name, limit)
        if lease is None:
            body = {
                "apiVersion": API_VERSION,
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec({}, now),
            }
            try:
                self._observe(await self._api.create_lease(self.namespace, body, limit))
            except KubeError as exc:
                if exc.status != 403:
                    raise
                # The chart and the kustomize base create the Lease; the account they bind
                # may not (docs/deployment.md, "Rights"). Wait for it rather than fail.
                raise KubeError(
                    f"does not exist, and this account may not create it ({exc}): waiting for "
                    "it; the chart and the kustomize base create it (was it deleted, or renamed "
                    "by an overlay?)",
                    403,
                ) from None
            return True
        self._observe(lease)
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity and not self._expired(spec):
            self._serving.leader = holder
            return False
        lease["spec"] = self._spec(spec, now)
        self._observe(await self._api.replace_lease(self.namespace, self.name, lease, limit))
        return True

    def _spec(self, old: dict[str, Any], now: str) -> dict[str, Any]:
        spec = {
            **old,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self._settings.lease_duration_seconds),
            "renewTime": now,
        }
        if old.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + (1 if old else 0)
        return spec

    def _observe(self, lease: Obj) -> None:
        self._lease = lease
        spec = lease.get("spec") or {}
        key = (spec.get("holderIdentity") or "", spec.get("renewTime") or "")
        if key != self._observed:
            self._observed = key
            self._observed_at = self._clock()

    def _expired(self, spec: dict[str, Any]) -> bool:
        duration = float(spec.get("leaseDurationSeconds") or 0)
        return self._observed_at + duration <= self._clock()

    def _holder_seen(self) -> str | None:
        holder = self._observed[0] if self._observed else ""
        return holder if holder and holder != self.identity else None

    # --- shutdown -------------------------------------------------------------------------

    async def release(self) -> None:
        """Give the Lease up (empty holder) if we were its last holder; call after run() was
        cancelled. Failures only delay the takeover until the Lease expires."""
        lease = self._lease
        old = (lease or {}).get("spec") or {}
        if lease is None or old.get("holderIdentity") != self.identity:
            return
        spec = {**old, "holderIdentity": "", "leaseDurationSeconds": 1}
        body = {**lease, "spec": spec}
        try:
            await self._api.replace_lease(
                self.namespace, self.name, body, self._settings.retry_period_seconds
            )
        except KubeError as exc:
            log.warning("leader election: releasing Lease %s failed: %s", self._serving.lease, exc)
            return
        log.info("leader election: %s released Lease %s", self.identity, self._serving.lease)
