"""What the provider's service account may do in a real kube-apiserver, with deploy/'s RBAC
and admission policy applied (fixtures/kube.py): exactly the table in docs/deployment.md
("Rights"), and none of the escalations a compromised provider would try.

The API server itself answers: a SelfSubjectRulesReview made with the provider's token lists
its rules per namespace; what every service account may do (the review of one without a
binding of its own: discovery, self reviews, reading ClusterTrustBundles) is taken out before
the comparison.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.kube import ENDPOINT_SLICE, JOURNAL, LEASE, NAMESPACE, NEEDS_KUBE, Kube
from fixtures.stack import wait_until
from kubernetes import client as k8s

pytestmark = [pytest.mark.kube, NEEDS_KUBE]

DOCS = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"
ELSEWHERE = "elsewhere"
POLICY = "cloudscale-autoscaler-leader-route"
Right = tuple[str, str, str, str]  # API group, resource, name ("*": any), verb


# --- the documented table ---------------------------------------------------------------------


def documented() -> dict[str, set[Right]]:
    """The rows of docs/deployment.md's Rights table, by where they apply: "cluster", "own
    namespace" or "default"."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("### Rights") :]
    section = section[: section.index("\n\n", section.index("| where |"))]  # the first table
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \| ([^|]+?) \| ([^|]+?) \| ([^|]+?) \|", section,
                      re.MULTILINE)  # fmt: skip
    rights: dict[str, set[Right]] = {}
    for where, group, resource, names, verbs in rows:
        if where == "where":  # the header
            continue
        api_group = "" if group == "core" else group.strip("`")
        name = "*" if names == "any" else names.strip("`")
        for verb in re.findall(r"`(\w+)`", verbs):
            rights.setdefault(where.strip("`"), set()).add(
                (api_group, resource.strip("`"), name, verb)
            )
    assert set(rights) == {"cluster", "own namespace", "default"}, rights
    return rights


def test_the_documented_table_is_what_the_kustomize_rbac_grants() -> None:
    """The table names the objects rbac.yaml names (the parse above is not vacuous)."""
    rights = documented()
    assert ("", "nodes", "*", "watch") in rights["cluster"]
    assert ("coordination.k8s.io", "leases", LEASE, "update") in rights["own namespace"]
    assert ("discovery.k8s.io", "endpointslices", ENDPOINT_SLICE, "patch") in rights[
        "own namespace"
    ]
    assert ("", "configmaps", JOURNAL, "patch") in rights["own namespace"]
    assert rights["default"] == {("", "events", "*", "create")}


# --- what the API server says ---------------------------------------------------------------


def rules_review(api: k8s.ApiClient, namespace: str) -> set[Right]:
    review = k8s.AuthorizationV1Api(api).create_self_subject_rules_review(
        {"spec": {"namespace": namespace}}
    )
    rights: set[Right] = set()
    for rule in review.status.resource_rules:
        for group in rule.api_groups or [""]:
            for resource in rule.resources or []:
                for name in rule.resource_names or ["*"]:
                    rights.update((group, resource, name, verb) for verb in rule.verbs)
    return rights


@pytest.mark.parametrize("namespace", [NAMESPACE, "default", ELSEWHERE])
async def test_the_api_server_grants_exactly_the_documented_rights(
    kube: Kube, namespace: str
) -> None:
    def review() -> tuple[set[Right], set[Right]]:
        with kube.client(kube.provider_kubeconfig) as provider:
            mine = rules_review(provider, namespace)
        with kube.client(kube.bystander_kubeconfig) as bystander:
            everyone = rules_review(bystander, namespace)
        return mine, everyone

    mine, everyone = await asyncio.to_thread(review)
    rights = documented()
    where = {NAMESPACE: "own namespace", "default": "default"}.get(namespace)
    expected = rights["cluster"] | (rights[where] if where else set())
    assert mine - everyone == expected


# --- what it must not do ----------------------------------------------------------------------


@contextlib.contextmanager
def victims(kube: Kube) -> Iterator[None]:
    """Objects of kube-system the provider must not touch, made by the admin (and removed)."""
    with kube.client() as api:
        core, coordination = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)
        discovery = k8s.DiscoveryV1Api(api)
        with contextlib.suppress(k8s.ApiException):
            core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
        made: list[Callable[[], Any]] = []
        core.create_namespaced_pod(NAMESPACE, {
            "metadata": {"name": "victim", "labels": {"app": "victim"}},
            "spec": {"automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "registry.k8s.io/coredns:v1"}]},
        })  # fmt: skip
        made.append(lambda: core.delete_namespaced_pod("victim", NAMESPACE, grace_period_seconds=0))
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "victim"},
                                                  "stringData": {"token": "s3cret"}})  # fmt: skip
        made.append(lambda: core.delete_namespaced_secret("victim", NAMESPACE))
        core.create_namespaced_service(NAMESPACE, {
            "metadata": {"name": "victim"},
            "spec": {"selector": {"app": "victim"}, "ports": [{"name": "dns", "port": 53}]},
        })  # fmt: skip
        made.append(lambda: core.delete_namespaced_service("victim", NAMESPACE))
        discovery.create_namespaced_endpoint_slice(NAMESPACE, {
            "metadata": {"name": "victim", "labels": {"kubernetes.io/service-name": "victim"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.53"]}],
            "ports": [{"name": "dns", "port": 53}],
        })  # fmt: skip
        made.append(lambda: discovery.delete_namespaced_endpoint_slice("victim", NAMESPACE))
        coordination.create_namespaced_lease(NAMESPACE, {
            "metadata": {"name": "kube-scheduler"}, "spec": {"holderIdentity": "scheduler"},
        })  # fmt: skip
        made.append(lambda: coordination.delete_namespaced_lease("kube-scheduler", NAMESPACE))
        core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "victim"},
                                                      "data": {"Corefile": "."}})  # fmt: skip
        made.append(lambda: core.delete_namespaced_config_map("victim", NAMESPACE))
        for namespace in (NAMESPACE, "default"):  # another component's Events
            core.create_namespaced_event(namespace, foreign_event(namespace))
            made.append(
                lambda namespace=namespace: core.delete_namespaced_event("victim", namespace)
            )
        try:
            yield
        finally:
            for undo in reversed(made):
                with contextlib.suppress(k8s.ApiException):
                    undo()


def refused(attempt: Callable[[], Any]) -> k8s.ApiException:
    with pytest.raises(k8s.ApiException) as caught:
        attempt()
    return caught.value


STRATEGIC = "application/strategic-merge-patch+json"
CA_LEASE = {"metadata": {"name": "cluster-autoscaler"}, "spec": {"holderIdentity": "provider"}}


def foreign_event(namespace: str) -> dict[str, Any]:
    """An Event another component wrote: the kubelet's about a Node in `default`, else the
    scheduler's about a Pod of `namespace`."""
    if namespace == "default":
        regarding = {"kind": "Node", "name": "worker-1"}
        reason, source = "NodeNotReady", "kubelet"
    else:
        regarding = {"kind": "Pod", "namespace": namespace, "name": "victim"}
        reason, source = "FailedScheduling", "default-scheduler"
    return {"metadata": {"name": "victim"}, "involvedObject": regarding, "reason": reason,
            "message": "0/3 nodes are available", "type": "Warning",
            "source": {"component": source}}  # fmt: skip


def escalations(api: k8s.ApiClient) -> dict[str, Callable[[], Any]]:
    """Each escalation as the provider's account, by what it would achieve."""
    core, coordination = k8s.CoreV1Api(api), k8s.CoordinationV1Api(api)
    discovery = k8s.DiscoveryV1Api(api)

    def patch_pod(body: dict[str, Any]) -> Callable[[], Any]:
        # Strategic merge: the container is matched by name, only its image changes.
        return lambda: core.patch_namespaced_pod("victim", NAMESPACE, body, _content_type=STRATEGIC)

    def steal_lease() -> Any:
        lease = {"metadata": {"name": "kube-scheduler"}, "spec": {"holderIdentity": "provider"}}
        return coordination.replace_namespaced_lease("kube-scheduler", NAMESPACE, lease)

    pod = {"metadata": {"name": "intruder"},
           "spec": {"containers": [{"name": "c", "image": "evil"}]}}  # fmt: skip
    return {
        "patch another Pod's image": patch_pod(
            {"spec": {"containers": [{"name": "c", "image": "evil"}]}}
        ),
        "patch another Pod's label": patch_pod({"metadata": {"labels": {"app": "other"}}}),
        "patch another Pod's annotation": patch_pod({"metadata": {"annotations": {"a": "b"}}}),
        "create a Pod": lambda: core.create_namespaced_pod(NAMESPACE, pod),
        "read a Secret": lambda: core.read_namespaced_secret("victim", NAMESPACE),
        "list Secrets": lambda: core.list_namespaced_secret(NAMESPACE),
        "take another Lease": steal_lease,
        "patch another EndpointSlice": lambda: discovery.patch_namespaced_endpoint_slice(
            "victim", NAMESPACE, {"endpoints": [{"addresses": ["10.9.9.9"]}]}
        ),
        "create an EndpointSlice": lambda: discovery.create_namespaced_endpoint_slice(
            NAMESPACE, {"metadata": {"name": "intruder"}, "addressType": "IPv4", "ports": []}
        ),
        "patch a Service": lambda: core.patch_namespaced_service(
            "victim", NAMESPACE, {"spec": {"selector": {"app": "provider"}}}
        ),
        "patch another ConfigMap": lambda: core.patch_namespaced_config_map(
            "victim", NAMESPACE, {"data": {"Corefile": "evil"}}
        ),
        "write Events elsewhere": lambda: core.create_namespaced_event(
            ELSEWHERE, {"metadata": {"name": "x"}, "involvedObject": {"kind": "Pod"}}
        ),
        # With `create` on Leases it made kube-system/cluster-autoscaler before CA started,
        # and CA never led.
        "create CA's Lease": lambda: coordination.create_namespaced_lease(NAMESPACE, CA_LEASE),
        "rewrite another component's Event": lambda: core.patch_namespaced_event(
            "victim", NAMESPACE, {"message": "all is well"}
        ),
        "rewrite a Node Event in default": lambda: core.patch_namespaced_event(
            "victim", "default", {"message": "all is well"}
        ),
        "delete an Event": lambda: core.delete_namespaced_event("victim", NAMESPACE),
    }


def outcome(attempt: Callable[[], Any]) -> int | str:
    """The HTTP status of a refusal, or "ALLOWED"."""
    try:
        attempt()
    except k8s.ApiException as exc:
        return int(exc.status or 0)
    return "ALLOWED"


async def test_the_escalations_a_compromised_provider_would_try_are_refused(kube: Kube) -> None:
    def attempt_all() -> dict[str, int | str]:
        with victims(kube), kube.client(kube.provider_kubeconfig) as api:
            return {what: outcome(attempt) for what, attempt in escalations(api).items()}

    outcomes = await asyncio.to_thread(attempt_all)
    assert outcomes == dict.fromkeys(outcomes, 403), outcomes


# --- its own EndpointSlice: the endpoints, nothing else -------------------------------------


def own_slice_patches() -> dict[str, dict[str, Any]]:
    """What the provider must not do to its own EndpointSlice, by what it would achieve."""
    pod = {"kind": "Pod", "namespace": NAMESPACE, "name": "provider-0"}
    endpoint = {"addresses": ["10.244.0.7"], "targetRef": pod}
    return {
        "move it into another Service": {
            "metadata": {"labels": {"kubernetes.io/service-name": "victim"}}
        },
        "list two endpoints": {"endpoints": [endpoint, {**endpoint, "addresses": ["10.9.9.9"]}]},
        "list an address that is not a Pod": {"endpoints": [{"addresses": ["10.9.9.9"]}]},
        "list a Pod of another namespace": {
            "endpoints": [{**endpoint, "targetRef": {**pod, "namespace": "default"}}]
        },
        "change its ports": {"ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]},
        "annotate it": {"metadata": {"annotations": {"example.com/x": "y"}}},
        "hold it with a finalizer": {"metadata": {"finalizers": ["example.com/keep"]}},
        "list two addresses": {
            "endpoints": [{**endpoint, "addresses": ["10.244.0.7", "10.9.9.9"]}]
        },
        "name a host for the endpoint": {"endpoints": [{**endpoint, "hostname": "dns"}]},
    }


async def test_its_own_endpointslice_takes_its_endpoint_and_nothing_else(kube: Kube) -> None:
    """The admission policy holds the provider's patches of its EndpointSlice to one endpoint,
    a Pod of its namespace: a relabelled slice would take another Service's traffic."""

    def patch(body: dict[str, Any]) -> Any:
        with kube.client(kube.provider_kubeconfig) as api:
            return k8s.DiscoveryV1Api(api).patch_namespaced_endpoint_slice(
                ENDPOINT_SLICE, NAMESPACE, body
            )

    pod = {"kind": "Pod", "namespace": NAMESPACE, "name": "provider-0"}
    allowed = {"endpoints": [{"addresses": ["10.244.0.7"], "targetRef": pod}]}
    assert (await asyncio.to_thread(patch, allowed)).endpoints[0].target_ref.name == "provider-0"
    attempts = own_slice_patches()

    async def enforced() -> bool:
        # The API server loads a new policy within a second or two; until then, wait (and
        # put back what an early attempt changed).
        try:
            await asyncio.to_thread(patch, attempts["move it into another Service"])
        except k8s.ApiException as exc:
            return exc.status == 422 and POLICY in str(exc.body)
        await asyncio.to_thread(restore_label)
        return False

    def restore_label() -> None:  # as the admin, whom the policy does not hold
        with kube.client() as api:
            k8s.DiscoveryV1Api(api).patch_namespaced_endpoint_slice(
                ENDPOINT_SLICE, NAMESPACE,
                {"metadata": {"labels": {"kubernetes.io/service-name": ENDPOINT_SLICE}}},
            )  # fmt: skip

    await wait_until(enforced, 10, "the admission policy never applied")
    for what, body in attempts.items():
        denial = await asyncio.to_thread(refused, lambda body=body: patch(body))
        assert denial.status == 422, (what, denial.status)
        assert POLICY in str(denial.body), (what, denial.body)
    assert (await asyncio.to_thread(patch, {"endpoints": []})).endpoints is None


# --- a replica's own token: its own Pod and no other -----------------------------------------


def bound_token(kube: Kube, namespace: str, account: str, pod: str) -> tuple[str, str]:
    """A token of `account` bound to a new Pod `pod` (as the kubelet mounts one into each
    Pod: the API server then knows which Pod holds it), and the Pod's uid."""
    with kube.client() as api:
        core = k8s.CoreV1Api(api)
        with contextlib.suppress(k8s.ApiException):  # exists already (the chart made it)
            core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
        made = core.create_namespaced_pod(namespace, {
            "metadata": {"name": pod},
            "spec": {"serviceAccountName": account, "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "cloudscale-autoscaler"}]},
        })  # fmt: skip
        uid = str(made.metadata.uid)
        request = {"spec": {"expirationSeconds": 3600, "boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}}}  # fmt: skip
        token = core.create_namespaced_service_account_token(account, namespace, request)
    return str(token.status.token), uid


def token_kubeconfig(kube: Kube, token: str, path: Path) -> Path:
    """The admin's kubeconfig with `token` as its user's credentials."""
    document = yaml.safe_load(kube.admin_kubeconfig.read_text(encoding="utf-8"))
    for user in document["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


async def test_a_replicas_own_token_lists_its_own_pod_and_no_other(
    kube: Kube, tmp_path: Path
) -> None:
    """The kubelet's token of a Pod names that Pod: the policy lets the replica list its own
    Pod (by name and uid) and refuses another Pod of the namespace, which a token not bound to
    a Pod may still name."""
    pod = "cloudscale-autoscaler-bound"
    token, uid = await asyncio.to_thread(bound_token, kube, NAMESPACE, "cloudscale-autoscaler", pod)
    kubeconfig = token_kubeconfig(kube, token, tmp_path / "bound.kubeconfig")

    def patch(name: str, uid: str) -> Any:
        target = {"kind": "Pod", "namespace": NAMESPACE, "name": name, "uid": uid}
        body = {"endpoints": [{"addresses": ["10.244.0.9"], "targetRef": target}]}
        with kube.client(kubeconfig) as api:
            return k8s.DiscoveryV1Api(api).patch_namespaced_endpoint_slice(
                ENDPOINT_SLICE, NAMESPACE, body
            )

    try:
        assert (await asyncio.to_thread(patch, pod, uid)).endpoints[0].target_ref.name == pod
        for name, other_uid in ((f"{pod}-other", uid), (pod, "another-uid")):
            denial = await asyncio.to_thread(refused, lambda n=name, u=other_uid: patch(n, u))
            assert denial.status == 422 and "its own Pod" in str(denial.body), denial.body
    finally:
        with kube.client() as api:
            k8s.CoreV1Api(api).delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0)
            k8s.DiscoveryV1Api(api).patch_namespaced_endpoint_slice(
                ENDPOINT_SLICE, NAMESPACE, {"endpoints": []}
            )
