"""The leader's label on its own Pod, which the gRPC Service selects.

Both replicas are Ready (each could serve if it led), so readiness cannot route CA to the
leader; this label does. The leader sets it once it serves and takes it off any other Pod
that still carries it (a leader killed with SIGKILL never removed its own); a replica removes
its own when it stops serving, when it shuts down, and at start (left from an earlier run of
the same Pod). A failed write is retried every retryPeriod until it succeeds: the Service
must follow the Lease, not the first attempt's luck.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from cloudscale_autoscaler.kube.api import KubeError, Obj

log = logging.getLogger(__name__)

LEADER_LABEL = "autoscaler.cloudscale.ch/leader"
LEADER_VALUE = "true"
SELECTOR = f"{LEADER_LABEL}={LEADER_VALUE}"


class PodApi(Protocol):
    async def list_pods(self, namespace: str, label_selector: str, limit: float) -> list[Obj]: ...

    async def label_pod(
        self, namespace: str, name: str, labels: dict[str, str | None], limit: float
    ) -> Obj: ...


class LeaderLabel:
    def __init__(self, api: PodApi, namespace: str, pod: str, retry_seconds: float) -> None:
        self._api = api
        self.namespace = namespace
        self.pod = pod
        self._retry = retry_seconds
        self._leading = False  # what the label should say
        self._done = False  # whether the Pods say it
        self._wake = asyncio.Event()

    def want(self, leading: bool) -> None:
        """Label this Pod (and only it) when leading, else unlabel it: soon, by run()."""
        if leading != self._leading:
            self._leading, self._done = leading, False
            self._wake.set()

    async def run(self) -> None:
        """Apply what want() asked for, retrying failures every retryPeriod, until cancelled.
        The first pass removes a label this Pod kept from an earlier run."""
        while True:
            self._wake.clear()
            if not self._done:
                leading = self._leading
                done = await self._apply(leading)
                # want() may have changed its mind during the write: then that change is
                # still to be made (its _done=False stands and it set _wake).
                if leading == self._leading:
                    self._done = done
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), None if self._done else self._retry)

    async def remove(self) -> None:
        """Unlabel this Pod now (shutdown): one attempt within a retryPeriod."""
        self._leading = False
        self._done = await self._apply(False)

    async def _apply(self, leading: bool) -> bool:
        try:
            if not await self._set(self.pod, LEADER_VALUE if leading else None):
                log.error(
                    "leader label: pod %s/%s does not exist (POD_NAME and POD_NAMESPACE come "
                    "from the downward API): the Service cannot select this replica",
                    self.namespace,
                    self.pod,
                )
                return True  # no retry makes it exist
            if leading:
                # Another Pod still labelled would share CA's traffic with us: its replica
                # died (or was cut off) while leading and could not remove its own.
                for pod in await self._api.list_pods(self.namespace, SELECTOR, self._retry):
                    name = (pod.get("metadata") or {}).get("name")
                    if name and name != self.pod and await self._set(name, None):
                        log.info("leader label: removed from pod %s (not the leader)", name)
        except KubeError as exc:
            log.warning(
                "leader label: could not %s pod %s/%s (retrying every %gs): %s",
                "label" if leading else "unlabel",
                self.namespace,
                self.pod,
                self._retry,
                exc,
            )
            return False
        log.info("leader label: pod %s/%s %s", self.namespace, self.pod,
                 f"labelled {SELECTOR}" if leading else f"carries no {LEADER_LABEL}")  # fmt: skip
        return True

    async def _set(self, pod: str, value: str | None) -> bool:
        """False when the Pod does not exist."""
        try:
            await self._api.label_pod(self.namespace, pod, {LEADER_LABEL: value}, self._retry)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
