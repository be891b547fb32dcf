"""Prices for CA's price expander (PricingNodePrice, PricingPodPrice).

How CA uses them (expander/price/price.go): for every scale-up option it asks NodePrice for
the group's template node over [now, now+1h] and PodPrice for each pod the option would
schedule plus a synthetic 500m/500Mi "stabilization" pod, and scores the option

    unfitness x (count x nodePrice + stabilization) / (sum of podPrices + stabilization)

(lowest wins). An error from NodePrice skips that option; an error from PodPrice skips every
option containing that pod. So NodePrice must be the group's real price, and PodPrice a price
that is the same for every option (it only weighs options against each other).

Node price: (flavor price + volumeSizeGB x volume price) per hour, times the interval. Billing
is per second, so the interval is not rounded. Pod price ("the theoretical minimum price of
running the pod on a perfectly matching machine", as CA's interface puts it; GCE prices
requests per core and per GiB): the cheapest configured group's price per hour times the
share of that group's node the pod occupies, its dominant share = the largest of request /
allocatable over the resources it requests and one of the node's pod slots. A group whose
nodes lack a requested resource (a GPU) cannot run the pod and is not considered. An option
that packs its pods perfectly onto the cheapest group thus scores about 1 before unfitness.

All arithmetic is exact (Decimal prices, Fraction shares and seconds); only the answer becomes
a float.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.engine.catalog import Catalog
from cloudscale_autoscaler.engine.errors import FailedPrecondition, GroupNotFound, InvalidArgument
from cloudscale_autoscaler.observability.echo import clip
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.protos.k8s.apimachinery import resource_pb2
from cloudscale_autoscaler.settings.types import Config, NodeGroupConfig, PricingConfig
from cloudscale_autoscaler.template.allocatable import PODS, node_allocatable, node_capacity
from cloudscale_autoscaler.template.node import ANNOTATION_CLUSTER, ANNOTATION_GROUP
from cloudscale_autoscaler.template.quantity import parse_quantity

SECONDS_PER_HOUR = 3600
SIDECAR_RESTART_POLICY = "Always"
# The well-known labels first, then their deprecated beta spellings (older kubelets, CA's
# own copies on template nodes).
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")


def hourly_price(pricing: PricingConfig, group: NodeGroupConfig) -> Decimal:
    """The price of one node of the group per hour. The loader guarantees a flavor price."""
    hourly = pricing.node_hourly(group.flavor, group.volume_size_gb)
    if hourly is None:
        raise FailedPrecondition(f"node group {group.name}: no price for flavor {group.flavor}")
    return hourly


def interval_seconds(start: Fraction, end: Fraction) -> Fraction:
    if end < start:
        raise ValueError(
            f"the interval ends (Unix time {float(end):.3f}) before it starts ({float(start):.3f})"
        )
    return end - start


def price_for(hourly: Decimal, seconds: Fraction) -> Fraction:
    return Fraction(hourly) * seconds / SECONDS_PER_HOUR


def as_double(price: Fraction, what: str, seconds: Fraction) -> float:
    """The answer CA reads (a double). Prices are bounded by the loader, so only an absurd
    request (a huge interval or pod request) gets here with a price beyond a double's range."""
    try:
        return float(price)
    except OverflowError as error:
        raise InvalidArgument(
            f"{what}: the price over {float(seconds):g} seconds is beyond a double's range"
        ) from error


# ---- pods ----------------------------------------------------------------------------------


def _quantities(quantities: Mapping[str, resource_pb2.Quantity], where: str) -> dict[str, Fraction]:
    """Parsed and non-negative (the API server refuses negative requests; priced, one would
    lower the price of the pod it is in). ValueError naming where the quantity is."""
    parsed = {}
    for name, quantity in quantities.items():
        at = f"{where}.{clip(name)}"
        try:
            amount = parse_quantity(quantity.string)
        except ValueError as error:
            raise ValueError(f"{at}: {error}") from error
        if amount < 0:
            raise ValueError(f'{at}: must not be negative, got "{clip(quantity.string)}"')
        parsed[name] = amount
    return parsed


def _requests(container: core_v1_pb2.Container, kind: str) -> dict[str, Fraction]:
    where = f"{kind} {clip(container.name) or '(no name)'}: requests"
    return _quantities(container.resources.requests, where)


def _add(total: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, Fraction(0)) + amount


def _raise_to(total: dict[str, Fraction], floor: Mapping[str, Fraction]) -> None:
    for name, amount in floor.items():
        total[name] = max(total.get(name, Fraction(0)), amount)


def pod_requests(pod: core_v1_pb2.Pod) -> dict[str, Fraction]:
    """What the scheduler reserves for the pod, as Kubernetes computes it: the containers'
    requests summed; init containers run one at a time before them, so the pod needs at least
    the largest of them, plus the sidecars (init containers with restartPolicy Always, which
    keep running and add to everything after them); pod-level requests where given; plus the
    pod overhead. Raises ValueError for a malformed or negative quantity."""
    spec = pod.spec
    total: dict[str, Fraction] = {}
    for container in spec.containers:
        _add(total, _requests(container, "container"))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.initContainers:
        requests = _requests(container, "init container")
        if container.restartPolicy == SIDECAR_RESTART_POLICY:
            _add(total, requests)
            _add(sidecars, requests)
            running = dict(sidecars)
        else:
            running = dict(requests)
            _add(running, sidecars)
        _raise_to(init_peak, running)
    _raise_to(total, init_peak)
    if spec.HasField("resources"):
        total.update(_quantities(spec.resources.requests, "resources.requests"))
    _add(total, _quantities(spec.overhead, "overhead"))
    return total


def dominant_share(
    requests: Mapping[str, Fraction], allocatable: Mapping[str, Fraction]
) -> Fraction | None:
    """The largest fraction of one node the pod takes (one pod slot at least); None when the
    node lacks a requested resource."""
    slots = allocatable.get(PODS, Fraction(0))
    if slots <= 0:
        return None
    share = 1 / slots
    for name, amount in requests.items():
        if amount <= 0:
            continue
        available = allocatable.get(name, Fraction(0))
        if available <= 0:
            return None
        share = max(share, amount / available)
    return share


@dataclass(frozen=True)
class Offer:
    """One group as a place to run pods: its price per hour and its node's allocatable."""

    group: str
    hourly: Decimal
    allocatable: Mapping[str, Fraction]


def cheapest_pod_price(
    requests: Mapping[str, Fraction], offers: Iterable[Offer], seconds: Fraction
) -> Fraction | None:
    prices = [
        price_for(offer.hourly, seconds) * share
        for offer in offers
        if (share := dominant_share(requests, offer.allocatable)) is not None
    ]
    return min(prices) if prices else None


# ---- the engine's view ---------------------------------------------------------------------


def _first(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    return next((labels[key] for key in keys if key in labels), None)


class Pricer:
    """Answers both pricing RPCs for a config with `pricing`."""

    def __init__(
        self,
        config: Config,
        pricing: PricingConfig,
        catalog: Catalog,
        group_of_provider_id: Callable[[str], str],
    ) -> None:
        self._config = config
        self._catalog = catalog
        self._group_of = group_of_provider_id
        self._hourly = {g.name: hourly_price(pricing, g) for g in config.node_groups}
        self._offers: tuple[object, list[Offer]] | None = None

    def node_price(
        self,
        provider_id: str,
        name: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        seconds: Fraction,
    ) -> float:
        group = self._node_group(provider_id, name, labels, annotations)
        shown = f"node {clip(name) or '(no name)'}"
        return as_double(price_for(self._hourly[group], seconds), shown, seconds)

    def _node_group(
        self, provider_id: str, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]
    ) -> str:
        """The node's group: by providerID (our inventory), else by the annotations our
        templates carry, else by instance type and zone (CA's template and upcoming nodes)."""
        if provider_id:
            group = self._group_of(provider_id)
            if group:
                return group
        annotated = annotations.get(ANNOTATION_GROUP, "")
        cluster = annotations.get(ANNOTATION_CLUSTER, self._config.cluster)
        if cluster == self._config.cluster and self._config.group(annotated) is not None:
            return annotated
        flavor = _first(labels, INSTANCE_TYPE_LABELS)
        zone = _first(labels, ZONE_LABELS)
        shown = f"node {clip(name) or '(no name)'} (providerID {clip(provider_id) or 'empty'})"
        if flavor is None:
            raise GroupNotFound(
                f"{shown} is not a server of any node group and carries no "
                f"{INSTANCE_TYPE_LABELS[0]} label to price it by"
            )
        candidates = [
            g
            for g in self._config.node_groups
            if g.flavor == flavor and (zone is None or g.zone in (None, zone))
        ]
        prices = {self._hourly[g.name] for g in candidates}
        if len(prices) == 1:
            return candidates[0].name
        where = f" in zone {clip(zone)}" if zone else ""
        if not candidates:
            raise GroupNotFound(
                f"{shown} is not a server of any node group, and no node group has flavor "
                f"{clip(flavor)}{where}"
            )
        names = ", ".join(g.name for g in candidates)
        raise GroupNotFound(
            f"{shown} is not a server of any node group, and the node groups with flavor "
            f"{flavor}{where} ({names}) have different prices"
        )

    async def pod_price(self, pod: core_v1_pb2.Pod, seconds: Fraction) -> float:
        try:
            requests = pod_requests(pod)
        except ValueError as error:
            raise InvalidArgument(f"pod {_pod_name(pod)}: {clip(str(error))}") from error
        price = cheapest_pod_price(requests, await self._current_offers(), seconds)
        if price is None:
            wanted = clip(", ".join(f"{k}={_amount(v)}" for k, v in sorted(requests.items())))
            raise FailedPrecondition(
                f"pod {_pod_name(pod)}: no node group has nodes with all it requests ({wanted})"
            )
        return as_double(price, f"pod {_pod_name(pod)}", seconds)

    async def _current_offers(self) -> list[Offer]:
        flavors = await self._catalog.flavors()
        # The catalog replaces its dict on every fetch: rebuild the offers only then.
        if self._offers is None or self._offers[0] is not flavors:
            self._offers = (flavors, self._build_offers(flavors))
        return self._offers[1]

    def _build_offers(self, flavors: Mapping[str, Flavor]) -> list[Offer]:
        offers = []
        for group in self._config.node_groups:
            flavor = flavors.get(group.flavor)
            if flavor is None:
                continue  # IncreaseSize refuses it too: no node of it will ever run a pod
            capacity = node_capacity(flavor, group.volume_size_gb, group.kubelet.max_pods)
            allocatable = node_allocatable(capacity, group.kubelet)
            offers.append(Offer(group.name, self._hourly[group.name], allocatable))
        return offers


def _amount(amount: Fraction) -> str:
    try:
        return f"{float(amount):g}"
    except OverflowError:  # a request of 1e400 is valid Kubernetes syntax
        return "(beyond a double's range)"


def _pod_name(pod: core_v1_pb2.Pod) -> str:
    meta = pod.metadata
    name = f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name
    return clip(name) or "(no name)"
