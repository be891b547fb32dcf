"""The smoke test's plan: the create request IncreaseSize would send for one more server of a
group (and the managed server group to make first), how it is shown, what it costs."""

from __future__ import annotations

import dataclasses
import time
from decimal import Decimal

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import ServerSpec
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.engine import names, spec
from cloudscale_autoscaler.engine.catalog import Catalog
from cloudscale_autoscaler.engine.catalogue_check import online_problems
from cloudscale_autoscaler.engine.errors import EngineError
from cloudscale_autoscaler.engine.networks import NetworkResolver
from cloudscale_autoscaler.engine.placement import Placement, managed_tags
from cloudscale_autoscaler.engine.pricing import hourly_price
from cloudscale_autoscaler.settings.types import Config, NodeGroupConfig
from cloudscale_autoscaler.template.userdata import UserDataError

# On the server and the server group smoke makes (value: when): the one tag IncreaseSize does
# not send, so that smoke's leftovers can be told from the group's real servers.
TAG_SMOKE = "k8s-autoscaler-smoke"


class StepFailed(Exception):
    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.reason = reason


class Timeline:
    """Each step's line with the seconds since the start."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def say(self, step: str, text: str) -> None:
        print(f"[+{time.monotonic() - self._start:7.2f}s] {step}: {text}", flush=True)


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: ServerSpec
    server_group_name: str | None
    server_group_tags: dict[str, str]
    node_labels: dict[str, str]


async def make_plan(
    config: Config, group: NodeGroupConfig, cloud: Cloud, request_id: str, stamp: str
) -> Plan:
    """As IncreaseSize builds it: the catalogue checked (engine/catalogue_check.py), the
    flavor's labels (engine/catalog.py), networks resolved (engine/networks.py), the request
    (engine/spec.py, engine/names.py); plus the smoke tag."""
    cluster = config.cluster
    try:
        problems = await online_problems([group], cloud)
        if problems:
            raise StepFailed("plan", "; ".join(problems))
        catalog = Catalog(config, cloud)
        await catalog.ensure()
        problem = catalog.creation_problem(group)
        if problem is not None:
            raise StepFailed("plan", problem)
        node_labels = catalog.node_labels(group)
        interfaces = await NetworkResolver(cloud).interfaces(group)
        name = names.server_name(cluster, group.name, names.random_suffix())
        request = spec.build_spec(cluster, group, name, request_id, node_labels, interfaces)
    except (EngineError, CloudError, UserDataError) as error:
        raise StepFailed("plan", str(error)) from error
    request = dataclasses.replace(request, tags={**request.tags, TAG_SMOKE: stamp})
    return Plan(request, *_server_group(config, group, cloud, stamp), node_labels)


def _server_group(
    config: Config, group: NodeGroupConfig, cloud: Cloud, stamp: str
) -> tuple[str | None, dict[str, str]]:
    """A new managed server group, named and tagged as the placement names and tags them
    (engine/placement.py), when the group has antiAffinity."""
    if not group.anti_affinity:
        return None, {}
    (slot,) = Placement(group.zone).assign(1, {}, f"{config.cluster}-{group.name}")
    assert slot.pending is not None  # no server group known: a new one
    tags = managed_tags(config.cluster, group.name)
    return slot.pending.name, {**tags, TAG_SMOKE: stamp}


def show_plan(config: Config, group: NodeGroupConfig, plan: Plan, timeline: Timeline) -> None:
    request = plan.spec
    timeline.say(
        "plan",
        f"node group {group.name} of cluster {config.cluster}, API {config.cloudscale.url}",
    )
    print(
        f"  server:       {request.name}, flavor {request.flavor}, image {request.image}, "
        f"zone {request.zone or '(project default)'}, {request.volume_size_gb} GB"
    )
    print(f"  networks:     {_networks(group, request)}")
    print(f"  server group: {_server_group_line(plan, request)}")
    print(f"  tags:         {tags_text(request.tags)}")
    print(f"  user data:    {_user_data_line(request, plan.node_labels)}")
    print(f"  cost:         {cost_text(config, group)}")


def cost_text(config: Config, group: NodeGroupConfig, seconds: float | None = None) -> str:
    """From the config's pricing section: the rate (and a 10-minute run), or the cost of
    `seconds` of the server."""
    pricing = config.pricing
    if pricing is None:
        return (
            "no estimate: the config has no pricing section (cloudscale.ch's price list has "
            f"flavor {group.flavor}'s price)"
        )
    hourly, currency = hourly_price(pricing, group), pricing.currency
    if seconds is None:
        ten_minutes = hourly * Decimal(10) / Decimal(60)
        return (
            f"{hourly} {currency}/h by the pricing section; a run of 10 minutes costs about "
            f"{ten_minutes:.4f} {currency}"
        )
    cost = hourly * Decimal(seconds) / Decimal(3600)
    return f"about {cost:.4f} {currency} ({seconds:.0f}s at {hourly} {currency}/h)"


def tags_text(tags: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in tags.items()) or "none"


def _networks(group: NodeGroupConfig, request: ServerSpec) -> str:
    if request.interfaces is not None and group.interfaces is not None:
        return ", ".join(
            _interface(written.network, sent.network, sent.subnet)
            for written, sent in zip(group.interfaces, request.interfaces, strict=True)
        )
    kinds = ["public"] if request.use_public_network else []
    kinds += ["the zone's default private network"] if request.use_private_network else []
    return " + ".join(kinds) or "none"


def _interface(written: str, uuid: str, subnet: str | None) -> str:
    shown = "public" if uuid == "public" else f"network {written}"
    if uuid not in ("public", written):
        shown += f" ({uuid})"
    return shown + (f", subnet {subnet}" if subnet else "")


def _server_group_line(plan: Plan, request: ServerSpec) -> str:
    if plan.server_group_name is not None:
        return (
            f"a new anti-affinity server group {plan.server_group_name} "
            f"(tags {tags_text(plan.server_group_tags)})"
        )
    return ", ".join(request.server_groups) or "none"


def _user_data_line(request: ServerSpec, node_labels: dict[str, str]) -> str:
    if request.user_data is None:
        return "none"
    labels = tags_text(node_labels) if node_labels else "no labels"
    return (
        f"{len(request.user_data.encode())} bytes, rendered for {request.name} "
        f"(${{node_labels}}: {labels}); not shown, it may hold secrets"
    )
