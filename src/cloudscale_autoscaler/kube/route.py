"""The gRPC Service's route to the leader: one EndpointSlice that the leader points at itself.

Both replicas are Ready (each could serve if it led), so readiness cannot route CA to the
leader. The chart's gRPC Service has no selector; the chart also creates one EndpointSlice for
it, empty, and the leader writes its own Pod's address (POD_IP) into it. The provider's account
may patch that one EndpointSlice and no Pod at all (docs/deployment.md, Rights).

- The leader writes its endpoint as soon as it serves, and again every retryPeriod while it
  serves: a `helm upgrade`, or a replica that led before and wrote late, may have changed it.
  An unchanged patch changes nothing (no new resourceVersion, no watch event). Each write is
  made only while the serving gate is open, which closes by itself at the renew deadline,
  before a standby may take the Lease: a leader too starved to notice it lost the Lease does
  not write over its successor.
- A replica that stops leading, or shuts down, empties the slice, but only while it still
  lists this Pod: the patch `test`s for our address and name, so it never removes a new
  leader's endpoint. At start a replica does the same, for an endpoint an earlier run of the
  same Pod left.
- A failed write is retried every retryPeriod; each new reason is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from cloudscale_autoscaler.kube.api import KubeError, Obj

log = logging.getLogger(__name__)

# What the API answers a JSON patch whose `test` failed (the slice lists another Pod, or none).
TEST_FAILED = 422


class SliceApi(Protocol):
    async def patch_endpoint_slice(
        self, namespace: str, name: str, patch: Obj | list[Obj], limit: float
    ) -> Obj: ...


def pod_endpoint(address: str, namespace: str, pod: str, uid: str) -> Obj:
    """This Pod as an EndpointSlice endpoint (what kube-proxy routes to)."""
    target = {"kind": "Pod", "namespace": namespace, "name": pod}
    if uid:
        target["uid"] = uid
    return {"addresses": [address], "conditions": {"ready": True}, "targetRef": target}


class LeaderRoute:
    def __init__(
        self,
        api: SliceApi,
        namespace: str,
        name: str,
        endpoint: Obj,
        retry_seconds: float,
        serving: Callable[[], bool],
    ) -> None:
        """`serving`: whether the gate is open now (Serving.active)."""
        self._api = api
        self._serving = serving
        self.namespace, self.name = namespace, name
        self._endpoint = endpoint
        self._retry = retry_seconds
        self._leading = False  # what the slice should say
        self._done = False  # whether it says it
        self._failure: str | None = None  # the last failure logged
        self._wake = asyncio.Event()

    @property
    def where(self) -> str:
        return f"EndpointSlice {self.namespace}/{self.name}"

    def want(self, leading: bool) -> None:
        """List this Pod when leading, else not: soon, by run()."""
        if leading != self._leading:
            self._leading, self._done = leading, False
            self._wake.set()

    async def run(self) -> None:
        """Apply what want() asked for until cancelled; re-assert it while leading."""
        while True:
            self._wake.clear()
            if self._leading or not self._done:
                leading = self._leading
                done = await self._apply(leading)
                # want() may have changed its mind during the write: then that change is
                # still to be made (its _done=False stands and it set _wake).
                if leading == self._leading:
                    self._done = done
            idle = self._done and not self._leading
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation
            # that comes as the event is set (want() then cancel(), as at shutdown).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if idle else self._retry):
                    await self._wake.wait()

    async def remove(self) -> None:
        """Stop routing to this Pod now (shutdown): one attempt."""
        self._leading = False
        self._done = await self._apply(False)

    async def _apply(self, leading: bool) -> bool:
        try:
            if leading:
                if not self._serving():
                    return False  # the gate closed at its deadline; stand_by comes next
                await self._patch({"endpoints": [self._endpoint]})
            else:
                await self._patch(self._unless_moved())
        except KubeError as exc:
            if not leading and exc.status == TEST_FAILED:
                return self._succeeded("does not list this Pod")
            self._failed(leading, exc)
            return False
        return self._succeeded("lists this Pod" if leading else "emptied")

    async def _patch(self, patch: Obj | list[Obj]) -> None:
        await self._api.patch_endpoint_slice(self.namespace, self.name, patch, self._retry)

    def _unless_moved(self) -> list[Obj]:
        """A JSON patch emptying the slice, applied only while it lists this very Pod."""
        address = self._endpoint["addresses"][0]
        pod = self._endpoint["targetRef"]["name"]
        return [
            {"op": "test", "path": "/endpoints/0/addresses/0", "value": address},
            {"op": "test", "path": "/endpoints/0/targetRef/name", "value": pod},
            {"op": "replace", "path": "/endpoints", "value": []},
        ]

    def _succeeded(self, what: str) -> bool:
        if not self._done or self._failure is not None:
            log.info("leader route: %s %s", self.where, what)
        self._failure = None
        return True

    def _failed(self, leading: bool, exc: KubeError) -> None:
        if exc.status == 404:
            reason = "not found: the gRPC Service routes to no replica; create it (the chart does)"
        else:
            reason = str(exc)
        if reason != self._failure:
            log.warning(
                "leader route: could not %s %s (retrying every %gs): %s",
                "point" if leading else "empty",
                self.where,
                self._retry,
                reason,
            )
        self._failure = reason
