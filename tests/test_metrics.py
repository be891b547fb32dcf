"""The /metrics, /healthz and /readyz endpoint of a provider started exactly as `serve` does."""

from __future__ import annotations

import grpc
import httpx
import pytest
from cryptography import x509
from fixtures.emulator import RunningEmulator
from fixtures.stack import Stack, StackFactory, group
from prometheus_client.parser import text_string_to_metric_families

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.settings.types import MetricsConfig

NAMED = [
    "cloudscale_autoscaler_grpc_requests",
    "cloudscale_autoscaler_grpc_request_duration_seconds",
    "cloudscale_autoscaler_cloud_api_requests",
    "cloudscale_autoscaler_cloud_api_request_duration_seconds",
    "cloudscale_autoscaler_node_group_min_size",
    "cloudscale_autoscaler_node_group_max_size",
    "cloudscale_autoscaler_node_group_target_size",
    "cloudscale_autoscaler_node_group_servers",
    "cloudscale_autoscaler_node_group_creations_in_flight",
    "cloudscale_autoscaler_node_group_placeholders",
    "cloudscale_autoscaler_last_successful_refresh_timestamp_seconds",
    "cloudscale_autoscaler_tls_certificate_expiry_timestamp_seconds",
    "cloudscale_autoscaler_build_info",
    "cloudscale_autoscaler_leader",
]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _url(stack: Stack, path: str) -> str:
    health = stack.running.health
    assert health is not None, "metrics.listen is configured"
    return f"http://127.0.0.1:{health.port}{path}"


async def _scrape(stack: Stack) -> tuple[set[str], Samples]:
    async with httpx.AsyncClient() as http:
        response = await http.get(_url(stack, "/metrics"))
    assert response.status_code == 200
    names: set[str] = set()
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        names.add(family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return names, samples


def _rpc_count(samples: Samples, method: str, code: str = "OK") -> float:
    key = ("cloudscale_autoscaler_grpc_requests_total", (("code", code), ("method", method)))
    return samples.get(key, 0.0)


def _group_gauge(samples: Samples, field: str, name: str) -> float:
    return samples[(f"cloudscale_autoscaler_node_group_{field}", (("group", name),))]


async def test_metrics_are_exposed_and_move_after_rpcs(stack: StackFactory) -> None:
    s = await stack(
        groups=[group("workers", min_size=1, max_size=7)],
        metrics=MetricsConfig(listen="127.0.0.1:0"),
    )
    names, before = await _scrape(s)
    assert set(NAMED) <= names
    assert _group_gauge(before, "min_size", "workers") == 1
    assert _group_gauge(before, "max_size", "workers") == 7
    assert _group_gauge(before, "target_size", "workers") == 0

    for _ in range(3):
        await s.target("workers")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await s.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="nope"))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    await s.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id="workers", delta=2))
    await s.settle("workers")

    _, after = await _scrape(s)
    method = "NodeGroupTargetSize"
    assert _rpc_count(after, method) - _rpc_count(before, method) >= 3
    assert _rpc_count(after, method, "NOT_FOUND") == _rpc_count(before, method, "NOT_FOUND") + 1
    assert _group_gauge(after, "target_size", "workers") == 2
    assert _group_gauge(after, "servers", "workers") == 2
    assert _group_gauge(after, "creations_in_flight", "workers") == 0
    creates = [
        v
        for (name, labels), v in after.items()
        if name == "cloudscale_autoscaler_cloud_api_requests_total"
        and ("operation", "create_server") in labels
    ]
    assert sum(creates) == 2
    refreshed = after[("cloudscale_autoscaler_last_successful_refresh_timestamp_seconds", ())]
    assert refreshed > 0
    served = x509.load_pem_x509_certificate(s.pki.server_cert.read_bytes())
    expiry = after[("cloudscale_autoscaler_tls_certificate_expiry_timestamp_seconds", ())]
    assert expiry == served.not_valid_after_utc.timestamp()
    assert after[("cloudscale_autoscaler_leader", ())] == 1, "without leader election it leads"


async def test_readyz_only_after_the_cloud_answered(
    stack: StackFactory, emulator: RunningEmulator
) -> None:
    # The API is down while the provider starts, so its first inventory load fails.
    await emulator.admin.set_faults({"down": True})
    s = await stack(metrics=MetricsConfig(listen="127.0.0.1:0"))
    async with httpx.AsyncClient() as http:
        assert (await http.get(_url(s, "/healthz"))).status_code == 200
        not_ready = await http.get(_url(s, "/readyz"))
        assert not_ready.status_code == 503
        assert "not ready" in not_ready.text

        await emulator.admin.clear_faults()
        await s.refresh()
        assert (await http.get(_url(s, "/readyz"))).status_code == 200
