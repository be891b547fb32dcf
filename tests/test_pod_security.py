"""The provider's Pods pass the `restricted` Pod Security Standard: a real kube-apiserver's
built-in PodSecurity admission admits them into a namespace labelled
`pod-security.kubernetes.io/enforce: restricted`.

Every install the chart renders (its defaults and each documented option that shapes the Pod)
and the kustomize base and example overlay: the Deployment's Pod template, created as a Pod in
that namespace with a server-side dry run, which runs every admission plugin and stores
nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures.kube import NEEDS_KUBE, Kube
from kubernetes import client as k8s
from test_deploy import (
    BASE,
    HELM_CASES,
    NEEDS_TOOL,
    OVERLAY,
    Bundle,
    Doc,
    helm_render,
    kustomize_build,
)

pytestmark = [pytest.mark.kube, NEEDS_KUBE, NEEDS_TOOL]

RESTRICTED = "restricted"
# Every value of the chart that shapes the Pod (values.yaml), set at once.
POD_OPTIONS = {
    "podLabels": {"team": "platform"},
    "podAnnotations": {"example.com/owner": "platform"},
    "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                     "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}}]}},
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "system-node-critical",
    "resources": {"requests": {"cpu": "100m", "memory": "192Mi"},
                  "limits": {"cpu": "2", "memory": "512Mi"}},
    "topologySpread": {"whenUnsatisfiable": "ScheduleAnyway"},
    "logFormat": "plain",
}  # fmt: skip
CASES: dict[str, list[str]] = {
    **{f"helm {name}": args for name, (args, _) in HELM_CASES.items()},
    "helm every pod option": [
        arg
        for key, value in POD_OPTIONS.items()
        for arg in ("--set-json", f"{key}={json.dumps(value)}")
    ],
}


@pytest.fixture(scope="module")
def restricted(kube: Kube) -> Iterator[str]:
    """A namespace that enforces (and warns about) the restricted level."""
    labels = {f"pod-security.kubernetes.io/{mode}": RESTRICTED for mode in ("enforce", "warn")}
    with kube.client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": RESTRICTED, "labels": labels}})
        try:
            yield RESTRICTED
        finally:
            core.delete_namespace(RESTRICTED)


def provider_pod(docs: list[Doc], namespace: str) -> Doc:
    template = Bundle(docs).provider()["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": "provider", "namespace": namespace},
        "spec": template["spec"],
    }


def admit(kube: Kube, pod: Doc) -> tuple[Any, list[str]]:
    """Create `pod` with a server-side dry run: the admitted Pod and the API's warnings."""
    namespace = pod["metadata"]["namespace"]
    with kube.client() as api:
        core = k8s.CoreV1Api(api)
        account = pod["spec"].get("serviceAccountName", "default")
        try:
            core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
        except k8s.ApiException as exc:
            assert exc.status == 409, exc  # made for an earlier case
        response = core.create_namespaced_pod_with_http_info(
            namespace, pod, dry_run="All", _preload_content=False
        )
        warnings = response.headers.getlist("Warning")
        return json.loads(response.data), warnings


async def assert_admitted(kube: Kube, docs: list[Doc], namespace: str) -> None:
    pod = provider_pod(docs, namespace)
    try:
        admitted, warnings = await asyncio.to_thread(admit, kube, pod)
    except k8s.ApiException as exc:
        raise AssertionError(f"refused: {exc.status} {exc.body}") from None
    assert admitted["metadata"]["namespace"] == namespace
    assert not [w for w in warnings if "PodSecurity" in w or "violate" in w], warnings


@pytest.mark.parametrize("case", CASES)
async def test_the_charts_pods_are_admitted_as_restricted(
    kube: Kube, helm: str, restricted: str, case: str
) -> None:
    await assert_admitted(kube, helm_render(helm, *CASES[case], namespace=restricted), restricted)


@pytest.mark.parametrize("directory", [BASE, OVERLAY], ids=["base", "overlay"])
async def test_the_kustomize_pods_are_admitted_as_restricted(
    kube: Kube, kustomize: list[str], restricted: str, directory: Any
) -> None:
    await assert_admitted(kube, kustomize_build(kustomize, directory), restricted)


async def test_a_pod_that_may_escalate_is_refused(kube: Kube, helm: str, restricted: str) -> None:
    """The check can fail: the chart's Pod with privilege escalation allowed is refused."""
    pod = provider_pod(helm_render(helm, namespace=restricted), restricted)
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(k8s.ApiException) as refused:
        await asyncio.to_thread(admit, kube, pod)
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false' in message
