"""The few Kubernetes API calls we make, with the `kubernetes` package.

Its calls block, so each runs in a worker thread (asyncio.to_thread) and carries a request
timeout: the event loop never waits on the Kubernetes API. Objects travel as plain JSON
dicts (`_preload_content=False`): listing thousands of Nodes through the package's models
would cost seconds of CPU, and the drift rules read JSON anyway.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

T = TypeVar("T")
Obj = dict[str, Any]

NODE_PAGE = 500
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubeError(Exception):
    """A failed call; `status` is the HTTP status, 0 when there was no answer."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class KubeConfigError(ValueError):
    """No usable credentials (kubeconfig or in-cluster service account) or namespace."""


def load_client(kubeconfig: Path | None, *, default_kubeconfig: bool = False) -> k8s.ApiClient:
    """An API client from `kubeconfig`; without one, the in-cluster service account, or, with
    `default_kubeconfig` outside a pod, $KUBECONFIG or ~/.kube/config as kubectl finds it."""
    configuration = k8s.Configuration()
    in_cluster = kubeconfig is None and (
        not default_kubeconfig or "KUBERNETES_SERVICE_HOST" in os.environ
    )
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(
                config_file=None if kubeconfig is None else str(kubeconfig),
                client_configuration=configuration,
            )
    except (ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        if in_cluster:
            where = "the in-cluster service account"
        else:
            where = f"kubeconfig {kubeconfig or os.environ.get('KUBECONFIG', '~/.kube/config')}"
        reason = " ".join(str(exc).split())  # YAML errors span lines; a log line does not
        raise KubeConfigError(f"cannot use {where}: {reason}") from None
    # One attempt per call: the elector and the drift check retry on their own schedule, and
    # urllib3's default three retries would log a warning each and hold a worker thread for up
    # to four request timeouts on an API that hangs.
    configuration.retries = 0
    return k8s.ApiClient(configuration)


def own_namespace() -> str | None:
    """The pod's namespace: POD_NAMESPACE, else the service account's namespace file."""
    if namespace := os.environ.get("POD_NAMESPACE"):
        return namespace
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class KubeApi:
    def __init__(self, api_client: k8s.ApiClient, timeout_seconds: float = 10.0) -> None:
        self._client = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._coordination = k8s.CoordinationV1Api(api_client)
        self._discovery = k8s.DiscoveryV1Api(api_client)
        self.timeout_seconds = timeout_seconds
        self.host: str = api_client.configuration.host

    async def _call(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        kwargs.setdefault("_request_timeout", self.timeout_seconds)

        def blocking() -> Obj:
            response = call(*args, _preload_content=False, **kwargs)
            try:
                parsed: Obj = json.loads(response.data)
            finally:
                response.release_conn()
            return parsed

        try:
            return await asyncio.to_thread(blocking)
        except k8s.ApiException as exc:
            raise KubeError(_api_message(exc), exc.status or 0) from None
        except Exception as exc:  # urllib3: connection refused, TLS, timeouts
            raise KubeError(f"{self.host} unreachable: {exc}") from None

    async def list_nodes(self) -> list[Obj]:
        nodes: list[Obj] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": NODE_PAGE}
            if token:
                kwargs["_continue"] = token
            page = await self._call(self._core.list_node, **kwargs)
            nodes += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return nodes

    async def get_lease(self, namespace: str, name: str, limit: float) -> Obj | None:
        try:
            return await self._call(
                self._coordination.read_namespaced_lease, name, namespace, _request_timeout=limit
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def create_lease(self, namespace: str, body: Obj, limit: float) -> Obj:
        return await self._call(
            self._coordination.create_namespaced_lease, namespace, body, _request_timeout=limit
        )

    async def replace_lease(self, namespace: str, name: str, body: Obj, limit: float) -> Obj:
        """Optimistic: body's metadata.resourceVersion must be current, else 409."""
        return await self._call(
            self._coordination.replace_namespaced_lease,
            name,
            namespace,
            body,
            _request_timeout=limit,
        )

    async def get_config_map(self, namespace: str, name: str, limit: float) -> Obj | None:
        try:
            return await self._call(
                self._core.read_namespaced_config_map, name, namespace, _request_timeout=limit
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def create_config_map(self, namespace: str, body: Obj, limit: float) -> Obj:
        return await self._call(
            self._core.create_namespaced_config_map, namespace, body, _request_timeout=limit
        )

    async def patch_config_map(self, namespace: str, name: str, patch: Obj, limit: float) -> Obj:
        """A merge patch; one naming metadata.resourceVersion applies only if that is still
        the object's (409 otherwise)."""
        return await self._call(
            self._core.patch_namespaced_config_map,
            name,
            namespace,
            patch,
            _content_type="application/merge-patch+json",
            _request_timeout=limit,
        )

    async def patch_endpoint_slice(
        self, namespace: str, name: str, patch: Obj | list[Obj], limit: float
    ) -> Obj:
        """A merge patch (a dict) or a JSON patch (a list of operations, `test` included)."""
        kind = "merge-patch" if isinstance(patch, dict) else "json-patch"
        return await self._call(
            self._discovery.patch_namespaced_endpoint_slice,
            name,
            namespace,
            patch,
            _content_type=f"application/{kind}+json",
            _request_timeout=limit,
        )

    async def create_event(self, namespace: str, body: Obj, limit: float) -> Obj:
        return await self._call(
            self._core.create_namespaced_event, namespace, body, _request_timeout=limit
        )

    def close(self) -> None:
        self._client.close()


def _api_message(exc: k8s.ApiException) -> str:
    """The API's own Status message when it sent one."""
    try:
        status = json.loads(exc.body or "")
        message = status.get("message") if isinstance(status, dict) else None
    except ValueError:
        message = None
    return f"{exc.status} {exc.reason}: {message or exc.body or ''}".strip()
