"""The validated configuration: typed, immutable, and the only shape the rest of the code sees.

`load_config` (config.loader, a room above) turns YAML into these dataclasses or raises
ConfigError with every problem found, each as `<path>: <reason>`. Nothing here checks a value:
the checks live with the reading, in config/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

DEFAULT_LISTEN = "0.0.0.0:8086"
DEFAULT_API_URL = "https://api.cloudscale.ch/v1"
DEFAULT_GPU_LABEL = "cloudscale.ch/gpu"
DEFAULT_MAX_PODS = 110


class ConfigError(Exception):
    """Every problem found in a config, each formatted as `<path>: <reason>`."""

    def __init__(self, errors: list[str], source: str = "", partial: Config | None = None) -> None:
        self.errors = errors
        self.source = source
        # What the loader made of the file despite the errors (defaults where a value was
        # wrong), so a caller can run its own checks in the same pass: check-config reads
        # the TLS files a valid `tls` section names. None when the file was not read at all.
        self.partial = partial
        prefix = f"{source}: " if source else ""
        super().__init__(prefix + "invalid config:\n" + "\n".join(f"  {e}" for e in errors))


@dataclass(frozen=True)
class TLSConfig:
    cert: Path | None = None
    key: Path | None = None
    client_ca: Path | None = None
    # Client certificate CNs / DNS SANs allowed to call; empty = any client the CA signed.
    allowed_clients: tuple[str, ...] = ()
    insecure: bool = False


@dataclass(frozen=True)
class CloudscaleConfig:
    url: str = DEFAULT_API_URL
    # The API token itself; never logged, never part of an error message or repr.
    token: str = field(default="", repr=False)
    token_file: Path | None = None
    timeout_seconds: float = 30.0
    max_concurrent_creates: int = 10
    # Client-side rate limit over all API requests; None = unlimited.
    requests_per_second: float | None = None
    # How long the flavor list is reused before a Refresh reads it again.
    flavor_cache_seconds: float = 300.0


@dataclass(frozen=True)
class MetricsConfig:
    # host:port of the /metrics, /healthz, /readyz endpoint; None = disabled.
    listen: str | None = None


@dataclass(frozen=True)
class LeaderElectionConfig:
    """A coordination.k8s.io/v1 Lease elects the one replica that serves (client-go's
    defaults: 15 s lease, 10 s renew deadline, 2 s retry period)."""

    enabled: bool = False
    lease_name: str = "cloudscale-autoscaler"
    # None: the pod's own namespace (POD_NAMESPACE, else the service account's namespace file).
    namespace: str | None = None
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    # The ConfigMap (in the Lease's namespace) holding the creation journal: creates in flight,
    # recorded before they are sent, read by whichever replica leads next. "": <leaseName>-journal.
    journal_config_map: str = ""
    # The EndpointSlice of the gRPC Service that the leader points at its own Pod (POD_IP);
    # None: this replica routes nothing (the Service is not the chart's, or not in a Pod).
    endpoint_slice: str | None = None

    @property
    def journal_name(self) -> str:
        return self.journal_config_map or f"{self.lease_name}-journal"


@dataclass(frozen=True)
class KubernetesConfig:
    """The optional `kubernetes:` section: the API connection, drift checks, leader election."""

    # None: the in-cluster service account.
    kubeconfig: Path | None = None
    # How often live Nodes are compared with the templates; 0 = never.
    drift_interval_seconds: float = 300.0
    # Relative difference of a resource below which a node does not count as drifted.
    drift_tolerance: float = 0.03
    leader_election: LeaderElectionConfig = LeaderElectionConfig()


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True)
class KubeletConfig:
    """Kubelet reservations; quantities are canonical Kubernetes strings, as configured.

    eviction_hard values are either a quantity ("100Mi") or a percentage ("10%").
    When the config gives neither evictionHard nor a configFile with one, the kubelet
    defaults apply (memory.available 100Mi, nodefs.available 10%, ...).
    """

    max_pods: int = DEFAULT_MAX_PODS
    system_reserved: tuple[tuple[str, str], ...] = ()
    kube_reserved: tuple[tuple[str, str], ...] = ()
    eviction_hard: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class AutoscalingOptions:
    """Per-group overrides for NodeGroupGetOptions; None = take CA's default from the request."""

    scale_down_utilization_threshold: float | None = None
    scale_down_gpu_utilization_threshold: float | None = None
    scale_down_unneeded_seconds: float | None = None
    scale_down_unready_seconds: float | None = None
    max_node_provision_seconds: float | None = None
    max_node_startup_seconds: float | None = None
    zero_or_max_node_scaling: bool | None = None
    ignore_daemonsets_utilization: bool | None = None
    allow_non_atomic_scale_up_to_max: bool | None = None


# The `network` of an interface on the public network, as the API spells it.
PUBLIC_NETWORK = "public"


@dataclass(frozen=True)
class NetworkInterface:
    """One entry of a group's `interfaces`: the public network, or a private network given by
    UUID or by name (resolved through the API) with an optional subnet UUID."""

    network: str  # PUBLIC_NETWORK, a network UUID or a network name
    subnet: str | None = None

    @property
    def public(self) -> bool:
        return self.network == PUBLIC_NETWORK


@dataclass(frozen=True)
class PricingConfig:
    """Prices per hour in `currency`: per flavor slug, and per GB of root volume."""

    currency: str
    flavors: tuple[tuple[str, Decimal], ...]
    volume_gb: Decimal = Decimal(0)

    def flavor(self, slug: str) -> Decimal | None:
        return dict(self.flavors).get(slug)

    def node_hourly(self, flavor: str, volume_size_gb: int) -> Decimal | None:
        """A server's price per hour: its flavor plus its root volume; None if unpriced."""
        price = self.flavor(flavor)
        return None if price is None else price + self.volume_gb * volume_size_gb


@dataclass(frozen=True)
class NodeGroupConfig:
    name: str
    min_size: int
    max_size: int
    flavor: str
    image: str
    zone: str | None = None
    volume_size_gb: int = 10
    ssh_keys: tuple[str, ...] = ()
    server_groups: tuple[str, ...] = ()  # server group UUIDs
    # The provider keeps the group's servers in anti-affinity server groups it creates itself.
    anti_affinity: bool = False
    # The `name` of the config entry this group was fanned out from by `zones` (this group is
    # `<pool>-<zone>`); its templates carry it as a label, so CA can balance the zones.
    pool: str | None = None
    use_public_network: bool = True
    use_private_network: bool = False
    use_ipv6: bool = True
    # The API's `interfaces` (exclusive with use_public_network/use_private_network); None =
    # the use_* flags decide.
    interfaces: tuple[NetworkInterface, ...] | None = None
    # The user-data template (file contents already read); placeholders validated at load.
    user_data: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    kubelet: KubeletConfig = KubeletConfig()
    autoscaling_options: AutoscalingOptions | None = None


def with_entries(groups: tuple[NodeGroupConfig, ...]) -> list[tuple[int, NodeGroupConfig]]:
    """Each group with the index of the `nodeGroups` entry it came from, for config paths:
    the groups one entry fanned out by `zones` come one after the other, with its name as
    their `pool`."""
    indexed: list[tuple[int, NodeGroupConfig]] = []
    entry, previous = -1, None
    for group in groups:
        if group.pool is None or previous is None or previous.pool != group.pool:
            entry += 1
        indexed.append((entry, group))
        previous = group
    return indexed


@dataclass(frozen=True)
class Config:
    cluster: str
    node_groups: tuple[NodeGroupConfig, ...]
    listen: str = DEFAULT_LISTEN
    tls: TLSConfig = TLSConfig()
    cloudscale: CloudscaleConfig = CloudscaleConfig()
    metrics: MetricsConfig = MetricsConfig()
    gpu_label: str = DEFAULT_GPU_LABEL
    # How long a failed creation stays listed as a placeholder instance (placeholderExpiry).
    placeholder_expiry_seconds: float = 900.0
    # IncreaseSize returns an error (and undoes the bump) only for creations rejected within
    # this wait; later failures reach CA as placeholders in NodeGroupNodes.
    increase_size_wait_seconds: float = 0.05
    # Prices for CA's price expander; None = both pricing RPCs answer UNIMPLEMENTED.
    pricing: PricingConfig | None = None
    # None: no Kubernetes API connection (no drift checks, no leader election).
    kubernetes: KubernetesConfig | None = None
    # Where the creation journal's file lives when it is not a ConfigMap (no `kubernetes`
    # section, or no namespace known); None: the default place (journal/file.py).
    state_dir: Path | None = None

    @property
    def elects(self) -> bool:
        return self.kubernetes is not None and self.kubernetes.leader_election.enabled

    def group(self, name: str) -> NodeGroupConfig | None:
        for group in self.node_groups:
            if group.name == name:
                return group
        return None
