"""The creation journal in a ConfigMap of a real kube-apiserver, written with the provider's
service account and deploy/'s RBAC: only the holder writes (a replica that held it before is
refused), the installer's labels stay, and a missing ConfigMap says what to create.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from fixtures.kube import JOURNAL, NAMESPACE, NEEDS_KUBE, Kube, reset_election
from kubernetes import client as k8s

from cloudscale_autoscaler.journal.entries import Entry, decode
from cloudscale_autoscaler.journal.store import JournalError
from cloudscale_autoscaler.journal.writer import Journal
from cloudscale_autoscaler.kube.api import KubeApi, load_client
from cloudscale_autoscaler.kube.journal import KEY, ConfigMapStore

pytestmark = [pytest.mark.kube, NEEDS_KUBE]

CLUSTER = "prod"
ONE = Entry("9f2c0000aabbccdd", "workers", "prod-workers-ab12cd34", "2026-11-27T10:00:00Z")
TWO = Entry("77770000aabbccdd", "workers", "prod-workers-zz98yx76", "2026-11-27T10:00:01Z")


@pytest.fixture
async def provider_api(kube: Kube) -> AsyncIterator[KubeApi]:
    """The Kubernetes API as the provider's service account, with a fresh journal."""
    await asyncio.to_thread(reset_election, kube)
    api = KubeApi(await asyncio.to_thread(load_client, kube.provider_kubeconfig))
    yield api
    await asyncio.to_thread(api.close)
    await asyncio.to_thread(reset_election, kube)


def journal_of(api: KubeApi, holder: str, in_flight: list[Entry]) -> Journal:
    store = ConfigMapStore(api, NAMESPACE, JOURNAL, 5.0)
    return Journal(store, CLUSTER, holder, lambda: list(in_flight))


def stored(kube: Kube) -> k8s.V1ConfigMap:
    with kube.client() as api:
        return k8s.CoreV1Api(api).read_namespaced_config_map(JOURNAL, NAMESPACE)


async def test_only_the_holder_writes_and_the_next_one_reads_what_it_left(
    kube: Kube, provider_api: KubeApi
) -> None:
    def label() -> None:  # as `helm install` leaves it
        with kube.client() as api:
            k8s.CoreV1Api(api).patch_namespaced_config_map(
                JOURNAL,
                NAMESPACE,
                {"metadata": {"labels": {"app.kubernetes.io/managed-by": "Helm"}}},
            )

    await asyncio.to_thread(label)
    mine = [ONE]
    old = journal_of(provider_api, "pod-a", mine)
    assert (await old.claim()).entries == []
    await old.persist()
    new = journal_of(provider_api, "pod-b", [])
    assert (await new.claim()).entries == [ONE]
    mine.append(TWO)  # the old leader, waking up late, would send another batch
    with pytest.raises(JournalError, match="now held by pod-b"):
        await old.persist()
    config_map = await asyncio.to_thread(stored, kube)
    decoded = decode(config_map.data[KEY], CLUSTER)
    assert (decoded.holder, decoded.entries) == ("pod-b", [ONE])
    assert config_map.metadata.labels["app.kubernetes.io/managed-by"] == "Helm"


async def test_a_missing_configmap_names_what_to_create(kube: Kube, provider_api: KubeApi) -> None:
    def delete() -> None:
        with kube.client() as api:
            k8s.CoreV1Api(api).delete_namespaced_config_map(JOURNAL, NAMESPACE)

    await asyncio.to_thread(delete)
    try:
        with pytest.raises(JournalError) as missing:
            await journal_of(provider_api, "pod-a", []).claim()
        assert str(missing.value) == (
            f"ConfigMap {NAMESPACE}/{JOURNAL} does not exist and this account may not create "
            "it: create it empty (the chart and the kustomize base do): "
            f"kubectl -n {NAMESPACE} create configmap {JOURNAL}"
        )
        # An account that may create it (an administrator's kubeconfig) does.
        admin = KubeApi(await asyncio.to_thread(load_client, kube.admin_kubeconfig))
        try:
            claim = await journal_of(admin, "pod-a", [ONE]).claim()
            assert (
                claim.entries == []
                and claim.doubt == f"ConfigMap {NAMESPACE}/{JOURNAL} was deleted"
            )
        finally:
            await asyncio.to_thread(admin.close)
        assert decode((await asyncio.to_thread(stored, kube)).data[KEY], CLUSTER).holder == "pod-a"
    finally:
        await asyncio.to_thread(reset_election, kube)


async def test_a_configmap_deleted_while_held_is_written_anew_or_named(
    kube: Kube, provider_api: KubeApi
) -> None:
    """Deleted by hand while a replica holds it: every write failed with "not found" until the
    process restarted. Now the next write makes it again where the account may create it, and
    says what to create where it may not."""

    def delete() -> None:
        with kube.client() as api:
            k8s.CoreV1Api(api).delete_namespaced_config_map(JOURNAL, NAMESPACE)

    mine: list[Entry] = []
    held = journal_of(provider_api, "pod-a", mine)
    await held.claim()
    await asyncio.to_thread(delete)
    mine.append(ONE)
    try:
        with pytest.raises(JournalError, match="may not create it: create it empty"):
            await held.persist()
        admin = KubeApi(await asyncio.to_thread(load_client, kube.admin_kubeconfig))
        try:
            by_admin = journal_of(admin, "pod-a", mine)
            await by_admin.claim()
            await asyncio.to_thread(delete)
            mine.append(TWO)
            await by_admin.persist()
        finally:
            await asyncio.to_thread(admin.close)
        decoded = decode((await asyncio.to_thread(stored, kube)).data[KEY], CLUSTER)
        assert (decoded.holder, decoded.entries) == ("pod-a", [ONE, TWO])
    finally:
        await asyncio.to_thread(reset_election, kube)
