"""The chart's rights on a real kube-apiserver (fixtures/kube.py), for every value combination
they depend on: `helm install` (helm 4) of the chart into a namespace of its own, then asked with
the account's own token. Its rules review is docs/deployment.md's table (with the release's
names), the escalations a compromised provider would try are refused, and the admission policy
holds a replica's Pod-bound token to its own Pod at an address of podCIDRs.

Also the kustomize base under a `namePrefix` overlay, which the docs forbid: applied beside the
base, its account may neither renew its own Lease nor patch its own EndpointSlice (the names in
its Role and config do not follow the prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.kube import NAMESPACE, NEEDS_KUBE, Kube
from fixtures.tools import HELM4, KUSTOMIZE, ensure
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils
from kubernetes.dynamic import DynamicClient
from test_kube_rights import (
    CA_LEASE,
    ELSEWHERE,
    Right,
    bound_token,
    documented,
    foreign_event,
    outcome,
    rules_review,
    token_kubeconfig,
)

pytestmark = [pytest.mark.kube, NEEDS_KUBE]

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "cloudscale-autoscaler"
KUSTOMIZE_BASE = ROOT / "deploy" / "kustomize" / "base"
KUSTOMIZE_NAME = "cloudscale-autoscaler"  # the names docs/deployment.md's table shows
POD_CIDR = "10.244.0.0/16"


@dataclass(frozen=True)
class Case:
    """An install whose rights differ: its release, namespace, values and account."""

    release: str
    values: dict[str, Any] = field(default_factory=dict)
    account: str = ""  # "": the chart's own, named like the release
    elects: bool = True
    kubernetes: bool = True

    @property
    def namespace(self) -> str:
        return f"rights-{self.release}"

    @property
    def fullname(self) -> str:
        return f"{self.release}-cloudscale-autoscaler"

    @property
    def service_account(self) -> str:
        return self.account or self.fullname


CASES = {
    # The defaults: two replicas electing a leader; podCIDRs given.
    "two-replicas": Case("ha", {"kubernetes": {"leaderElection": {"podCIDRs": [POD_CIDR]}}}),
    "one-replica": Case(
        "single",
        {"replicas": 1, "kubernetes": {"leaderElection": {"enabled": False}}},
        elects=False,
    ),
    "custom-account": Case("custom", {"serviceAccount": {"name": "custom-sa"}}, "custom-sa"),
    "existing-account": Case(
        "existing", {"serviceAccount": {"create": False, "name": "platform-sa"}}, "platform-sa"
    ),
    "no-kubernetes": Case(
        "offline",
        {"replicas": 1, "kubernetes": {"enabled": False}},
        elects=False,
        kubernetes=False,
    ),
}


def helm(kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [ensure(HELM4), *args, "--kubeconfig", str(kube.admin_kubeconfig)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def install(kube: Kube, case: Case, directory: Path) -> None:
    """`helm install` as a user would (no cert-manager in this API server, and no --wait: it
    runs no Pods); an existing account is made first, as its owner would."""
    with kube.client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": case.namespace}})
        if case.account and not case.values.get("serviceAccount", {}).get("create", True):
            core.create_namespaced_service_account(
                case.namespace, {"metadata": {"name": case.account}}
            )
    values = directory / f"{case.release}.yaml"
    values.write_text(yaml.safe_dump({"certManager": {"enabled": False}, **case.values}))
    done = helm(kube, "install", case.release, str(CHART), "--namespace", case.namespace,
                "-f", str(values))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Case]]:
    directory = tmp_path_factory.mktemp("rights")
    try:
        for case in CASES.values():
            install(kube, case, directory)
        yield CASES
    finally:
        for case in CASES.values():
            helm(kube, "uninstall", case.release, "--namespace", case.namespace)


def account_kubeconfig(kube: Kube, case: Case, path: Path) -> Path:
    """A token of the case's account (not bound to a Pod), as a kubeconfig."""
    return token_of(kube, case.namespace, case.service_account, path)


def token_of(kube: Kube, namespace: str, account: str, path: Path) -> Path:
    with kube.client() as api:
        token = k8s.CoreV1Api(api).create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 3600}}
        )
    return token_kubeconfig(kube, str(token.status.token), path)


def expected_rights(case: Case, where: str) -> set[Right]:
    """docs/deployment.md's rows for `where` with the release's names; without leader election
    those of the Nodes, the Events and the journal, without the kubernetes section none."""
    if not case.kubernetes:
        return set()
    rows = documented().get(where, set())
    if not case.elects:
        rows = {row for row in rows if row[1] in ("nodes", "events", "configmaps")}
    return {(group, resource, name.replace(KUSTOMIZE_NAME, case.fullname), verb)
            for group, resource, name, verb in rows}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
async def test_the_account_has_exactly_the_documented_rights(
    kube: Kube, installed: dict[str, Case], name: str, tmp_path: Path
) -> None:
    case = installed[name]
    kubeconfig = await asyncio.to_thread(account_kubeconfig, kube, case, tmp_path / "sa")

    def reviews() -> dict[str, tuple[set[Right], set[Right]]]:
        found = {}
        for namespace in (case.namespace, "default", ELSEWHERE):
            with kube.client(kubeconfig) as mine, kube.client(kube.bystander_kubeconfig) as any_:
                found[namespace] = (rules_review(mine, namespace), rules_review(any_, namespace))
        return found

    where = {case.namespace: "own namespace", "default": "default", ELSEWHERE: "elsewhere"}
    for namespace, (mine, everyone) in (await asyncio.to_thread(reviews)).items():
        expected = expected_rights(case, "cluster") | expected_rights(case, where[namespace])
        assert mine - everyone == expected, (namespace, mine - everyone)


def escalations(api: k8s.ApiClient, case: Case) -> dict[str, Callable[[], Any]]:
    core, coordination = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)
    return {
        "create CA's Lease": lambda: coordination.create_namespaced_lease(case.namespace, CA_LEASE),
        "create a Lease in kube-system": lambda: coordination.create_namespaced_lease(
            NAMESPACE, CA_LEASE
        ),
        "rewrite another component's Event": lambda: core.patch_namespaced_event(
            "victim", case.namespace, {"message": "all is well"}
        ),
        "rewrite a Node Event in default": lambda: core.patch_namespaced_event(
            "victim", "default", {"message": "all is well"}
        ),
        "delete an Event": lambda: core.delete_namespaced_event("victim", case.namespace),
        "read a Secret": lambda: core.list_namespaced_secret(case.namespace),
        "patch a Pod": lambda: core.patch_namespaced_pod(
            "victim", case.namespace, {"metadata": {"labels": {"a": "b"}}}
        ),
    }


@contextlib.contextmanager
def foreign_events(kube: Kube, namespace: str) -> Iterator[None]:
    with kube.client() as api:
        core = k8s.CoreV1Api(api)
        for where in (namespace, "default"):
            with contextlib.suppress(k8s.ApiException):  # left by another case
                core.create_namespaced_event(where, foreign_event(where))
        yield
        for where in (namespace, "default"):
            with contextlib.suppress(k8s.ApiException):
                core.delete_namespaced_event("victim", where)


@pytest.mark.parametrize("name", list(CASES))
async def test_the_escalations_are_refused(
    kube: Kube, installed: dict[str, Case], name: str, tmp_path: Path
) -> None:
    case = installed[name]
    kubeconfig = await asyncio.to_thread(account_kubeconfig, kube, case, tmp_path / "sa")

    def attempt_all() -> dict[str, int | str]:
        with foreign_events(kube, case.namespace), kube.client(kubeconfig) as api:
            return {what: outcome(attempt) for what, attempt in escalations(api, case).items()}

    outcomes = await asyncio.to_thread(attempt_all)
    print(f"{name}: {outcomes}")
    assert outcomes == dict.fromkeys(outcomes, 403), outcomes


async def test_the_namespaces_default_account_gets_nothing(
    kube: Kube, installed: dict[str, Case], tmp_path: Path
) -> None:
    """With an existing account the rights are bound to it, never to `default`."""
    case = installed["existing-account"]

    def review() -> tuple[set[Right], set[Right]]:
        with kube.client() as api, contextlib.suppress(k8s.ApiException):
            # kube-controller-manager makes it in a real cluster; this API server runs none.
            k8s.CoreV1Api(api).create_namespaced_service_account(
                case.namespace, {"metadata": {"name": "default"}}
            )
        default = Case(case.release, account="default")
        kubeconfig = account_kubeconfig(kube, default, tmp_path / "default")
        with kube.client(kubeconfig) as mine, kube.client(kube.bystander_kubeconfig) as any_:
            return rules_review(mine, case.namespace), rules_review(any_, case.namespace)

    mine, everyone = await asyncio.to_thread(review)
    assert mine - everyone == set()


async def test_a_replica_lists_its_own_pod_at_a_pod_network_address_only(
    kube: Kube, installed: dict[str, Case], tmp_path: Path
) -> None:
    """The chart's policy with the replica's Pod-bound token: its own Pod at an address of
    podCIDRs passes; another address, or another Pod, is refused (422, naming the policy)."""
    case = installed["two-replicas"]
    pod = f"{case.fullname}-abc12-xyz"
    token, uid = await asyncio.to_thread(
        bound_token, kube, case.namespace, case.service_account, pod
    )
    kubeconfig = token_kubeconfig(kube, token, tmp_path / "bound")

    def patch(address: str, name: str = pod) -> int | str:
        target = {"kind": "Pod", "namespace": case.namespace, "name": name, "uid": uid}
        body = {"endpoints": [{"addresses": [address], "targetRef": target}]}
        with kube.client(kubeconfig) as api:
            return outcome(
                lambda: k8s.DiscoveryV1Api(api).patch_namespaced_endpoint_slice(
                    case.fullname, case.namespace, body
                )
            )

    assert await asyncio.to_thread(patch, "10.244.3.4") == "ALLOWED"
    assert await asyncio.to_thread(patch, "10.9.9.9") == 422, "outside podCIDRs"
    assert await asyncio.to_thread(patch, "10.244.3.4", f"{case.fullname}-other") == 422


# --- the kustomize base under a namePrefix overlay (forbidden) -------------------------------

PREFIX = "x-"
# What the prefixed overlay's account needs: its RBAC and the objects it would write.
ACCESS_KINDS = frozenset(
    {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Lease",
     "EndpointSlice", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
)  # fmt: skip


def prefixed_objects(directory: Path) -> list[dict[str, Any]]:
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(KUSTOMIZE_BASE, directory)],
        "namePrefix": PREFIX,
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    built = subprocess.run([ensure(KUSTOMIZE), "build", str(directory)], capture_output=True,
                           text=True, timeout=120, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr
    docs = [doc for doc in yaml.safe_load_all(built.stdout) if doc]
    return [doc for doc in docs if doc["kind"] in ACCESS_KINDS]


async def test_a_name_prefixed_kustomize_overlay_cannot_use_its_own_objects(
    kube: Kube, tmp_path: Path
) -> None:
    """Applied beside the base: the prefixed account's Role still names the base's objects, so
    the API server refuses it its own Lease and its own EndpointSlice (403). The docs forbid
    such an overlay."""
    documents = prefixed_objects(tmp_path)
    account = f"{PREFIX}{KUSTOMIZE_NAME}"
    assert {d["metadata"]["name"] for d in documents if d["kind"] == "Lease"} == {account}

    def attempt() -> dict[str, int | str]:
        with kube.client() as api:
            for doc in documents:
                k8s_utils.create_from_dict(api, doc)
        token = token_of(kube, NAMESPACE, account, tmp_path / "prefixed")
        with kube.client(token) as api:
            coordination, discovery = k8s.CoordinationV1Api(api), k8s.DiscoveryV1Api(api)
            return {
                "read its Lease": outcome(
                    lambda: coordination.read_namespaced_lease(account, NAMESPACE)
                ),
                "patch its EndpointSlice": outcome(
                    lambda: discovery.patch_namespaced_endpoint_slice(
                        account, NAMESPACE, {"endpoints": []}
                    )
                ),
            }

    try:
        outcomes = await asyncio.to_thread(attempt)
    finally:
        await asyncio.to_thread(delete_all, kube, documents)
    assert outcomes == {"read its Lease": 403, "patch its EndpointSlice": 403}, outcomes


def delete_all(kube: Kube, documents: list[dict[str, Any]]) -> None:
    with kube.client() as api:
        dynamic = DynamicClient(api)
        for doc in documents:
            resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            with contextlib.suppress(Exception):
                resource.delete(name=doc["metadata"]["name"],
                                namespace=doc["metadata"].get("namespace"))  # fmt: skip
