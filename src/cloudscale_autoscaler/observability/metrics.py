"""Prometheus metrics (served by endpoint.py).

Nothing is updated on the hot path: the per-RPC counters and latency histograms are atomics in
the compiled transport, and the per-group gauges are the engine's state; custom collectors read
both at scrape time, so neither serving nor scaling work pays for metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cloudscale_autoscaler import __version__

NAMESPACE = "cloudscale_autoscaler"
# RPCs answer in microseconds to seconds (IncreaseSize waits for the first create).
RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
               1.0, 2.5, 5.0, 10.0)  # fmt: skip
CLOUD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class GroupStats:
    """One node group's state as the engine sees it, read at scrape time."""

    name: str
    min_size: int
    max_size: int
    target_size: int
    servers: int
    creations_in_flight: int
    placeholders: int
    servers_above_max_size: int
    # Anti-affinity server groups the provider manages for the group (antiAffinity).
    server_groups: int


class _GroupCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[GroupStats]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        families = {
            field: GaugeMetricFamily(f"{NAMESPACE}_node_group_{field}", help_, labels=["group"])
            for field, help_ in (
                ("min_size", "Configured minimum size of the node group."),
                ("max_size", "Configured maximum size of the node group."),
                ("target_size", "Target size answered to the Cluster Autoscaler."),
                ("servers", "Servers of the node group in the cloud inventory."),
                ("creations_in_flight", "Server creations started and not yet finished."),
                ("placeholders", "Failed-creation placeholder instances."),
                (
                    "servers_above_max_size",
                    "Listed servers beyond maxSize: another provider creates servers for the "
                    "cluster (or maxSize was lowered).",
                ),
                (
                    "server_groups",
                    "Anti-affinity server groups the provider manages for the node group "
                    "(antiAffinity), listed or being created.",
                ),
            )
        }
        for stats in self._source():
            for field, family in families.items():
                family.add_metric([stats.name], float(getattr(stats, field)))
        yield from families.values()


@dataclass(frozen=True)
class RpcReading:
    """One RPC's figures as the transport counted them, read at scrape time."""

    method: str
    codes: dict[str, int]  # status code name -> calls answered with it
    buckets: list[int]  # observations per RPC_BUCKETS bucket (not cumulative), then +Inf
    seconds: float  # sum of the durations


class _RpcCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[RpcReading]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            f"{NAMESPACE}_grpc_requests",
            "gRPC requests handled, by method and status code.",
            labels=["method", "code"],
        )
        duration = HistogramMetricFamily(
            f"{NAMESPACE}_grpc_request_duration_seconds",
            "gRPC request handling time.",
            labels=["method"],
        )
        bounds = [str(b) for b in RPC_BUCKETS] + ["+Inf"]  # as prometheus_client spells them
        for reading in self._source():
            for code, count in reading.codes.items():
                requests.add_metric([reading.method, code], count)
            if not reading.codes:
                continue  # like a labelled Histogram: no series before the first call
            cumulative, total = [], 0
            for bound, count in zip(bounds, reading.buckets, strict=True):
                total += count
                cumulative.append((bound, float(total)))
            duration.add_metric([reading.method], cumulative, reading.seconds)
        yield requests
        yield duration


class Metrics:
    """All metrics of one provider process, in a registry of their own (tests run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Info(f"{NAMESPACE}_build", "Build information.", registry=r).info({"version": __version__})
        self.cloud_requests = Counter(
            f"{NAMESPACE}_cloud_api_requests",
            "cloudscale.ch API HTTP requests, by operation and HTTP status ('error' if none).",
            ["operation", "status"],
            registry=r,
        )
        self.cloud_duration = Histogram(
            f"{NAMESPACE}_cloud_api_request_duration_seconds",
            "cloudscale.ch API request time.",
            ["operation"],
            buckets=CLOUD_BUCKETS,
            registry=r,
        )
        self.last_refresh = Gauge(
            f"{NAMESPACE}_last_successful_refresh_timestamp_seconds",
            "Unix time of the last successful Refresh (inventory listing).",
            registry=r,
        )
        self.tls_expiry = Gauge(
            f"{NAMESPACE}_tls_certificate_expiry_timestamp_seconds",
            "Unix time at which the served TLS certificate expires.",
            registry=r,
        )
        self.config_reload_success = Gauge(
            f"{NAMESPACE}_config_reload_success",
            "1 when the last reload of the config file was applied (or none was tried), 0 when "
            "it was refused and the running configuration kept.",
            registry=r,
        )
        self.config_reload_success.set(1)
        self.config_loaded = Gauge(
            f"{NAMESPACE}_config_last_reload_success_timestamp_seconds",
            "Unix time at which the running configuration was loaded (at start or by a reload).",
            registry=r,
        )
        # Per replica, so that an alert sees "no replica leads" as the max over replicas.
        self.leader = Gauge(
            f"{NAMESPACE}_leader",
            "1 while this replica serves the CloudProvider RPCs (the Lease holder, or the only "
            "replica without leader election), else 0.",
            registry=r,
        )

    def observe_cloud_request(self, operation: str, status: str, seconds: float) -> None:
        self.cloud_requests.labels(operation, status).inc()
        self.cloud_duration.labels(operation).observe(seconds)

    def track_groups(self, source: Callable[[], Iterable[GroupStats]]) -> None:
        self.registry.register(_GroupCollector(source))

    def track_rpcs(self, source: Callable[[], Iterable[RpcReading]]) -> None:
        self.registry.register(_RpcCollector(source))

    def track_reloads(self, source: Callable[[], Mapping[str, int]]) -> None:
        """Reload attempts by outcome (the reloader's counts, read at scrape time)."""
        self.registry.register(_ReloadCollector(source))

    def track_removed(self, source: Callable[[], Mapping[str, RemovedCounts]]) -> None:
        """What is left of node groups not configured (the engine's report)."""
        self.registry.register(_RemovedCollector(source))


class RemovedCounts(Protocol):
    @property
    def servers(self) -> int: ...

    @property
    def creations_in_flight(self) -> int: ...

    @property
    def server_groups(self) -> int: ...


class _ReloadCollector(Collector):
    def __init__(self, source: Callable[[], Mapping[str, int]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            f"{NAMESPACE}_config_reloads",
            "Reloads of the config file tried, by outcome: applied; refused (its content: "
            "invalid, unknown names, a setting only a restart changes); failed (anything "
            "else: the API could not be asked, an internal error).",
            labels=["outcome"],
        )
        for outcome, count in self._source().items():
            family.add_metric([outcome], count)
        yield family


class _RemovedCollector(Collector):
    def __init__(self, source: Callable[[], Mapping[str, RemovedCounts]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        families = {
            field: GaugeMetricFamily(
                f"{NAMESPACE}_unconfigured_group_{field}", help_, labels=["group"]
            )
            for field, help_ in (
                ("servers", "Listed servers tagged with a node group that is not configured "
                            "(removed or renamed): kept, not served."),
                ("creations_in_flight", "Creates of a node group a reload removed, sent "
                                        "before the reload and not listed yet."),
                ("server_groups", "Managed anti-affinity server groups of a node group that "
                                  "manages none (removed, renamed, antiAffinity off)."),
            )
        }  # fmt: skip
        for name, left in self._source().items():
            for field, family in families.items():
                family.add_metric([name], float(getattr(left, field)))
        yield from families.values()
