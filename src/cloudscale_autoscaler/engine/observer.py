"""What the engine reports beyond its RPC answers, as it happens: each failed creation (one
per placeholder) and each failed deletion, to whoever subscribed (Kubernetes Events, ...).

Listeners are called on the loop, inside the engine's synchronous stretches: they must only
note what happened and return (their slow work runs in tasks of their own). One that raises is
logged and skipped, so a listener's bug never breaks the engine's accounting.
"""

from __future__ import annotations

import logging
from typing import Protocol

from cloudscale_autoscaler.cloud.errors import CloudError

log = logging.getLogger(__name__)


class Listener(Protocol):
    def creation_failed(self, group: str, error: CloudError) -> None: ...

    def deletion_failed(self, group: str, uuid: str, node: str, error: CloudError) -> None:
        """`node`: the Node name CA sent with DeleteNodes; "" for a deletion resumed on
        Refresh, or when CA sent none."""


class Observer:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def creation_failed(self, group: str, error: CloudError) -> None:
        for listener in self._listeners:
            try:
                listener.creation_failed(group, error)
            except Exception:
                log.exception("observer %r failed on a failed creation", listener)

    def deletion_failed(self, group: str, uuid: str, node: str, error: CloudError) -> None:
        for listener in self._listeners:
            try:
                listener.deletion_failed(group, uuid, node, error)
            except Exception:
                log.exception("observer %r failed on a failed deletion", listener)
