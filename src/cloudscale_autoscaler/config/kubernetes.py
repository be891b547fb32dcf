"""The optional `kubernetes:` section: API connection, drift checks and leader election.

Durations follow client-go's leader election rules: leaseDuration > renewDeadline >
retryPeriod * 1.2 (its jitter factor), all above zero, so a leader always gives up the Lease
before a standby may take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from cloudscale_autoscaler.config.reader import Fields, as_written, describe, resolve
from cloudscale_autoscaler.config.values import (
    dns_label_error,
    dns_subdomain_error,
    parse_go_duration,
)
from cloudscale_autoscaler.settings.types import KubernetesConfig, LeaderElectionConfig
from cloudscale_autoscaler.template.quantity import parse_percent

KUBERNETES_KEYS = ("kubeconfig", "driftInterval", "driftTolerance", "leaderElection")
LEADER_ELECTION_KEYS = (
    "enabled",
    "leaseName",
    "namespace",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "journalConfigMap",
    "endpointSlice",
)
DEFAULT_DRIFT_INTERVAL = "5m"
DEFAULT_DRIFT_TOLERANCE = "3%"
DEFAULT_LEASE_DURATION = "15s"
DEFAULT_RENEW_DEADLINE = "10s"
DEFAULT_RETRY_PERIOD = "2s"
# client-go's JitterFactor: a retry may come this much later than retryPeriod.
RETRY_JITTER = 1.2


def parse_kubernetes(top: Fields, base_dir: Path) -> KubernetesConfig | None:
    """None when the section is absent: the product then never talks to Kubernetes."""
    if not top.present("kubernetes"):
        return None
    fields = top.section("kubernetes", KUBERNETES_KEYS)
    written = fields.string("kubeconfig")
    kubeconfig = None if written is None else resolve(base_dir, written)
    if kubeconfig is not None and fields.issues.offline:
        fields.issues.skip(fields.at("kubeconfig"), f"{kubeconfig} not read (offline)")
    elif kubeconfig is not None and not kubeconfig.is_file():
        fields.issues.add(fields.at("kubeconfig"), f"file not found: {kubeconfig}")
    interval = _duration(fields, "driftInterval", DEFAULT_DRIFT_INTERVAL, zero_allowed=True)
    return KubernetesConfig(
        kubeconfig=kubeconfig,
        drift_interval_seconds=interval,
        drift_tolerance=_tolerance(fields),
        leader_election=_leader_election(fields.section("leaderElection", LEADER_ELECTION_KEYS)),
    )


def _duration(fields: Fields, key: str, default: str, *, zero_allowed: bool = False) -> float:
    seconds = fields.duration(key, example=default)
    if seconds is None:
        return parse_go_duration(default)
    if seconds < 0 or (seconds == 0 and not zero_allowed):
        bound = ">= 0" if zero_allowed else "> 0"
        fields.issues.add(fields.at(key), f"must be {bound}, got {as_written(fields.raw(key))}")
    return seconds


def _tolerance(fields: Fields) -> float:
    raw = fields.raw("driftTolerance")
    if raw is not None and not isinstance(raw, str):
        # YAML reads `3` and `0.03` as numbers: name the form, not just the type.
        fields.issues.add(
            fields.at("driftTolerance"),
            f'expected a percentage such as "{DEFAULT_DRIFT_TOLERANCE}", got {describe(raw)}',
        )
        return float(parse_percent(DEFAULT_DRIFT_TOLERANCE)) / 100
    text = fields.string("driftTolerance") or DEFAULT_DRIFT_TOLERANCE
    try:
        percent = parse_percent(text)
    except ValueError as exc:
        fields.issues.add(fields.at("driftTolerance"), str(exc))
        return float(parse_percent(DEFAULT_DRIFT_TOLERANCE)) / 100
    if not 0 <= percent < 100:
        fields.issues.add(fields.at("driftTolerance"), f'must be from 0% to 99%, got "{text}"')
    return float(percent) / 100


def _leader_election(fields: Fields) -> LeaderElectionConfig:
    name = fields.string("leaseName") or LeaderElectionConfig.lease_name
    fields.issues.check(fields.at("leaseName"), dns_label_error(name))
    namespace = fields.string("namespace")
    if namespace is not None:
        fields.issues.check(fields.at("namespace"), dns_label_error(namespace))
    names = {key: _object_name(fields, key) for key in ("journalConfigMap", "endpointSlice")}
    lease = _duration(fields, "leaseDuration", DEFAULT_LEASE_DURATION)
    renew = _duration(fields, "renewDeadline", DEFAULT_RENEW_DEADLINE)
    retry = _duration(fields, "retryPeriod", DEFAULT_RETRY_PERIOD)
    if renew > 0 and lease <= renew:
        fields.issues.add(
            fields.at("leaseDuration"), f"must be greater than renewDeadline ({renew:g}s)"
        )
    if retry > 0 and renew <= retry * RETRY_JITTER:
        fields.issues.add(
            fields.at("renewDeadline"),
            f"must be greater than {RETRY_JITTER:g} x retryPeriod ({retry * RETRY_JITTER:g}s)",
        )
    return LeaderElectionConfig(
        enabled=fields.boolean("enabled") or False,
        lease_name=name,
        namespace=namespace,
        lease_duration_seconds=lease,
        renew_deadline_seconds=renew,
        retry_period_seconds=retry,
        journal_config_map=names["journalConfigMap"] or "",
        endpoint_slice=names["endpointSlice"],
    )


def _object_name(fields: Fields, key: str) -> str | None:
    name = fields.string(key)
    if name is not None and not fields.issues.check(fields.at(key), dns_subdomain_error(name)):
        return None
    return name


# What the Kubernetes client's in-cluster loading reads; a Pod's containers always have them.
IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


def outside_pod_error(settings: KubernetesConfig, env: Mapping[str, str]) -> str | None:
    """Why the in-cluster service account cannot be used here, as `<path>: <reason>`: no
    kubeconfig is given and the process runs outside a Pod. None otherwise."""
    if settings.kubeconfig is not None:
        return None
    missing = [name for name in IN_CLUSTER_ENV if not env.get(name)]
    if not missing:
        return None
    return (
        "kubernetes.kubeconfig: not set, so the in-cluster service account is used, but this "
        f"process runs outside a Pod ({' and '.join(missing)} not set): set "
        "kubernetes.kubeconfig to a kubeconfig file, or run it in a Pod"
    )


def kubernetes_text(settings: KubernetesConfig | None) -> str:
    """The `kubernetes:` line of check-config's summary."""
    if settings is None:
        return "disabled (no drift checks, no leader election)"
    api = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "in-cluster"
    interval = settings.drift_interval_seconds
    drift = (
        f"drift every {interval:g}s ({settings.drift_tolerance * 100:g}%)"
        if interval
        else "no drift"
    )
    election = settings.leader_election
    if not election.enabled:
        return f"{api}, {drift}, no leader election"
    namespace = election.namespace or "<pod namespace>"
    route = (
        f", the leader routes EndpointSlice {namespace}/{election.endpoint_slice}"
        if election.endpoint_slice
        else ""
    )
    return (
        f"{api}, {drift}, leader election on Lease {namespace}/{election.lease_name} "
        f"({election.lease_duration_seconds:g}s/{election.renew_deadline_seconds:g}s/"
        f"{election.retry_period_seconds:g}s){route}"
    )
