"""The Kubernetes API the campaign's replicas share, in memory: Leases and ConfigMaps with the
API server's optimistic concurrency (resourceVersion: a replace or a patch naming a version
that is no longer current is 409 Conflict), creates that conflict with an existing object,
404 for a missing one, Events accepted, no Nodes.

It stands in for kube-apiserver only where virtual time cannot reach a real one; the provider's
use of the real API is tested against a real kube-apiserver (tests/test_kube_*.py). Each
replica gets its own view (`view`), which the campaign can cut off from the API (every call
then fails as an unreachable API server does) and reconnect.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from cloudscale_autoscaler.kube.api import KubeError

Obj = dict[str, Any]


class KubeDouble:
    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._versions = itertools.count(1)
        self.events = 0

    def view(self, name: str) -> KubeView:
        return KubeView(self, name)

    # --- the store ------------------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        found = self._objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def create(self, kind: str, namespace: str, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        if (kind, namespace, name) in self._objects:
            raise KubeError(f'{kind} "{name}" already exists', 409)
        return self._store(kind, namespace, name, copy.deepcopy(body))

    def replace(self, kind: str, namespace: str, name: str, body: Obj) -> Obj:
        current = self._current(kind, namespace, name)
        if (
            body.get("metadata", {}).get("resourceVersion")
            != current["metadata"]["resourceVersion"]
        ):
            raise KubeError(f'{kind} "{name}": the object has been modified', 409)
        return self._store(kind, namespace, name, copy.deepcopy(body))

    def patch(self, kind: str, namespace: str, name: str, patch: Obj) -> Obj:
        """A merge patch; one naming metadata.resourceVersion only if that is current."""
        current = self._current(kind, namespace, name)
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise KubeError(f'{kind} "{name}": the object has been modified', 409)
        merged = _merge(copy.deepcopy(current), patch)
        return self._store(kind, namespace, name, merged)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self._objects.pop((kind, namespace, name), None)

    def _current(self, kind: str, namespace: str, name: str) -> Obj:
        found = self._objects.get((kind, namespace, name))
        if found is None:
            raise KubeError(f'{kind} "{name}" not found', 404)
        return found

    def _store(self, kind: str, namespace: str, name: str, body: Obj) -> Obj:
        metadata = body.setdefault("metadata", {})
        metadata.update(name=name, namespace=namespace, resourceVersion=str(next(self._versions)))
        self._objects[(kind, namespace, name)] = body
        return copy.deepcopy(body)


def _merge(target: Obj, patch: Obj) -> Obj:
    """RFC 7386: a null removes, a mapping merges, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class KubeView:
    """One replica's connection: KubeApi's methods, failing while `cut`."""

    def __init__(self, double: KubeDouble, name: str) -> None:
        self._double = double
        self.host = f"double for {name}"
        self.cut = False

    def _reach(self) -> KubeDouble:
        if self.cut:
            raise KubeError(f"{self.host} unreachable: connection refused")
        return self._double

    async def list_nodes(self) -> list[Obj]:
        self._reach()
        return []

    async def get_lease(self, namespace: str, name: str, limit: float) -> Obj | None:
        return self._reach().get("Lease", namespace, name)

    async def create_lease(self, namespace: str, body: Obj, limit: float) -> Obj:
        return self._reach().create("Lease", namespace, body)

    async def replace_lease(self, namespace: str, name: str, body: Obj, limit: float) -> Obj:
        return self._reach().replace("Lease", namespace, name, body)

    async def get_config_map(self, namespace: str, name: str, limit: float) -> Obj | None:
        return self._reach().get("ConfigMap", namespace, name)

    async def create_config_map(self, namespace: str, body: Obj, limit: float) -> Obj:
        return self._reach().create("ConfigMap", namespace, body)

    async def patch_config_map(self, namespace: str, name: str, patch: Obj, limit: float) -> Obj:
        return self._reach().patch("ConfigMap", namespace, name, patch)

    async def patch_endpoint_slice(
        self, namespace: str, name: str, patch: Obj | list[Obj], limit: float
    ) -> Obj:
        raise KubeError("the campaign routes CA itself: no EndpointSlice", 404)

    async def create_event(self, namespace: str, body: Obj, limit: float) -> Obj:
        self._reach().events += 1
        return body

    async def patch_event(self, namespace: str, name: str, body: Obj, limit: float) -> Obj:
        self._reach().events += 1
        return body

    def close(self) -> None:
        pass
