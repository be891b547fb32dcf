"""The creation journal in a ConfigMap only the leader writes (journal/writer.py says how).

The chart and the kustomize base create the ConfigMap, empty, so the provider's account needs
only get and patch on that one name. Every write is a merge patch of its one key naming the
resourceVersion read or written last: a replica that held the journal before and writes late
gets 409 Conflict, and the labels and annotations the installer put on it stay.
Where the account may create ConfigMaps (a kubeconfig of an administrator), a missing one is
created; where it may not, the error says what to create.
"""

from __future__ import annotations

from typing import Protocol

from cloudscale_autoscaler.journal.store import Conflict, Gone, JournalError, Stored
from cloudscale_autoscaler.kube.api import KubeError, Obj

KEY = "creations.json"


class ConfigMapApi(Protocol):
    async def get_config_map(self, namespace: str, name: str, limit: float) -> Obj | None: ...

    async def create_config_map(self, namespace: str, body: Obj, limit: float) -> Obj: ...

    async def patch_config_map(
        self, namespace: str, name: str, patch: Obj, limit: float
    ) -> Obj: ...


class ConfigMapStore:
    def __init__(self, api: ConfigMapApi, namespace: str, name: str, limit: float) -> None:
        self._api = api
        self.namespace, self.name = namespace, name
        self._limit = limit
        self.where = f"ConfigMap {namespace}/{name}"

    async def read(self) -> Stored:
        try:
            found = await self._api.get_config_map(self.namespace, self.name, self._limit)
        except KubeError as exc:
            raise JournalError(f"cannot read {self.where}: {exc}") from None
        if found is None:
            return Stored(None, missing=True)
        text = (found.get("data") or {}).get(KEY)
        return Stored(text if isinstance(text, str) else None, _version(found))

    async def write(self, text: str, version: str | None) -> str | None:
        try:
            if version is None:  # read found none
                return _version(await self._create(text))
            patch = {"metadata": {"resourceVersion": version}, "data": {KEY: text}}
            return _version(
                await self._api.patch_config_map(self.namespace, self.name, patch, self._limit)
            )
        except KubeError as exc:
            raise self._failure(exc, creating=version is None) from None

    async def _create(self, text: str) -> Obj:
        metadata = {"name": self.name, "namespace": self.namespace}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {KEY: text}}
        return await self._api.create_config_map(self.namespace, body, self._limit)

    def _failure(self, exc: KubeError, *, creating: bool) -> JournalError:
        if exc.status == 409:
            return Conflict(f"{self.where} changed since it was read")
        if exc.status == 404 and not creating:
            return Gone(f"{self.where} was deleted")
        if creating and exc.status == 403:
            return JournalError(
                f"{self.where} does not exist and this account may not create it: create it "
                "empty (the chart and the kustomize base do): "
                f"kubectl -n {self.namespace} create configmap {self.name}"
            )
        return JournalError(f"cannot write {self.where}: {exc}")


def _version(config_map: Obj) -> str | None:
    version = (config_map.get("metadata") or {}).get("resourceVersion")
    return version if isinstance(version, str) else None
