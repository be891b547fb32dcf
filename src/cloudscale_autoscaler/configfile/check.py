"""`cloudscale-autoscaler check-config [--online]`: validate, summarise, optionally ask the API.

Exit codes: 0 = valid (and, with --online, every flavor, image and zone exists), 2 = any error,
including an unreachable API or a rejected token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from cloudscale_autoscaler.cloud.errors import AuthenticationError, CloudError
from cloudscale_autoscaler.cloud.models import Flavor, Image, Network, Region, Subnet
from cloudscale_autoscaler.cloud.protocol import Cloud
from cloudscale_autoscaler.config import Config, ConfigError, NodeGroupConfig, PricingConfig
from cloudscale_autoscaler.config_loader import TOKEN_ENV
from cloudscale_autoscaler.configfile.advice import config_warnings
from cloudscale_autoscaler.configfile.interfaces import interfaces_text
from cloudscale_autoscaler.configfile.kubernetes import kubernetes_text
from cloudscale_autoscaler.configfile.network_check import (
    interface_errors,
    networks_to_check,
)
from cloudscale_autoscaler.configfile.pricing import price_text, pricing_text
from cloudscale_autoscaler.logs import to_stderr
from cloudscale_autoscaler.validation import uuid_error

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_INVALID = 2
# An interactive check should fail within seconds, not after the server's full retry budget.
ONLINE_MAX_RETRIES = 1


def run_check(path: Path, online: bool) -> int:
    from cloudscale_autoscaler.config_loader import load_config

    try:
        config = load_config(path)
    except ConfigError as exc:
        _print_errors(f"{path}: invalid config", exc.errors)
        return EXIT_INVALID
    start_errors = _start_errors(config)
    if start_errors:
        _print_errors(f"{path}: invalid config", start_errors)
        return EXIT_INVALID
    print(f"{path}: config OK")
    print(summary(config))
    for warning in config_warnings(config):
        to_stderr(log, logging.WARNING, warning, plain_prefix="warning: ")
    if not online:
        return EXIT_OK
    return _online(config)


def _start_errors(config: Config) -> list[str]:
    """What `serve` would refuse to start with: the same loads and checks, the same messages
    (the TLS files; the Kubernetes credentials and Lease namespace)."""
    from cloudscale_autoscaler.transport.tls import TLSFileError, load_material

    errors: list[str] = []
    tls = config.tls
    if not tls.insecure and tls.cert and tls.key and tls.client_ca:
        try:
            load_material(tls.cert, tls.key, tls.client_ca)
        except TLSFileError as exc:
            errors.append(str(exc))
    if config.kubernetes is not None:
        # Imported only here: without the section nothing loads the kubernetes package.
        from cloudscale_autoscaler.kube.api import KubeConfigError
        from cloudscale_autoscaler.kube.link import preflight

        try:
            preflight(config.kubernetes)
        except KubeConfigError as exc:
            errors.append(str(exc))
    return errors


def _print_errors(headline: str, errors: Sequence[str]) -> None:
    to_stderr(log, logging.ERROR, headline, errors)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _tls_line(config: Config) -> str:
    tls = config.tls
    if tls.insecure:
        return "INSECURE: plaintext gRPC, no client authentication"
    clients = ", ".join(tls.allowed_clients) or "any certificate the CA signed"
    return f"mTLS, cert {tls.cert}, client CA {tls.client_ca}, allowed clients: {clients}"


def _token_line(config: Config) -> str:
    # Where the token came from, never the token.
    if config.cloudscale.token_file is not None:
        return f"from file {config.cloudscale.token_file}"
    return f"from the {TOKEN_ENV} environment variable"


def group_line(group: NodeGroupConfig, pricing: PricingConfig | None = None) -> str:
    return (
        f"{group.name}: size {group.min_size}-{group.max_size}, flavor {group.flavor}, "
        f"image {group.image}, zone {group.zone or '(project default)'}, "
        f"volume {group.volume_size_gb} GB, {_count(len(group.labels), 'label')}, "
        f"{_count(len(group.taints), 'taint')}, "
        f"options: {'yes' if group.autoscaling_options is not None else 'no'}, "
        f"interfaces: {interfaces_text(group)}"
        + (f", price {price_text(pricing, group)}" if pricing is not None else "")
    )


def summary(config: Config) -> str:
    cloud = config.cloudscale
    rate = f"{cloud.requests_per_second:g}/s" if cloud.requests_per_second else "unlimited"
    lines = [
        f"cluster:            {config.cluster}",
        f"listen:             {config.listen}",
        f"tls:                {_tls_line(config)}",
        f"metrics:            {config.metrics.listen or 'disabled'}",
        f"api url:            {cloud.url}",
        f"api token:          {_token_line(config)}",
        f"api limits:         timeout {cloud.timeout_seconds:g}s, "
        f"{cloud.max_concurrent_creates} concurrent creates, rate {rate}",
        f"gpu label:          {config.gpu_label}",
        f"placeholder expiry: {config.placeholder_expiry_seconds:g}s",
        f"pricing:            {pricing_text(config.pricing)}",
        f"kubernetes:         {kubernetes_text(config.kubernetes)}",
        f"node groups ({len(config.node_groups)}):",
    ]
    lines += [f"  {group_line(group, config.pricing)}" for group in config.node_groups]
    return "\n".join(lines)


def _known(slugs: Sequence[str]) -> str:
    return ", ".join(sorted(slugs)) or "none"


def _custom_image(image: str) -> bool:
    """Custom images (`custom:<slug>` or a UUID) are not in /v1/images; they are not checked."""
    return image.startswith("custom:") or uuid_error(image) is None


def _zone_errors(at: str, kind: str, slug: str, zones: tuple[str, ...], zone: str) -> list[str]:
    # An empty zone list means the API did not say: assume available everywhere.
    if not zones or zone in zones:
        return []
    return [
        f'{at}: {kind} "{slug}" is not available in zone "{zone}" (available in: {_known(zones)})'
    ]


def catalogue_errors(
    groups: Sequence[NodeGroupConfig],
    flavors: Sequence[Flavor],
    images: Sequence[Image],
    regions: Sequence[Region],
) -> list[str]:
    """Every group's flavor, image and zone checked against the API's catalogue."""
    by_flavor = {flavor.slug: flavor for flavor in flavors}
    by_image = {image.slug: image for image in images}
    zones = sorted({zone for region in regions for zone in region.zones})
    errors: list[str] = []
    for index, group in enumerate(groups):
        at = f"nodeGroups[{index}]"
        flavor = by_flavor.get(group.flavor)
        if flavor is None:
            errors.append(
                f'{at}.flavor: unknown flavor "{group.flavor}" (known: {_known(list(by_flavor))})'
            )
        custom = _custom_image(group.image)
        image = None if custom else by_image.get(group.image)
        if image is None and not custom:
            errors.append(
                f'{at}.image: unknown image "{group.image}" (known: {_known(list(by_image))})'
            )
        if group.zone is None:
            continue
        if group.zone not in zones:
            errors.append(f'{at}.zone: unknown zone "{group.zone}" (known: {_known(zones)})')
            continue
        if flavor is not None:
            errors += _zone_errors(f"{at}.flavor", "flavor", flavor.slug, flavor.zones, group.zone)
        if image is not None:
            errors += _zone_errors(f"{at}.image", "image", image.slug, image.zones, group.zone)
    return errors


Catalogue = tuple[list[Flavor], list[Image], list[Region]]


async def fetch_catalogue(cloud: Cloud) -> Catalogue:
    return await cloud.list_flavors(), await cloud.list_images(), await cloud.list_regions()


async def _fetch_online(
    config: Config,
) -> tuple[Catalogue, tuple[list[Network], list[Subnet]]]:
    """What the online check compares the config with, through one client."""
    from cloudscale_autoscaler.cloud.client import CloudscaleClient

    client = CloudscaleClient.from_config(config.cloudscale)
    client.max_retries = ONLINE_MAX_RETRIES
    async with client:
        return await fetch_catalogue(client), await networks_to_check(config.node_groups, client)


def _online(config: Config) -> int:
    url = config.cloudscale.url
    try:
        (flavors, images, regions), (networks, subnets) = asyncio.run(_fetch_online(config))
    except AuthenticationError as exc:
        _print_errors(
            f"online check against {url} failed",
            [f"cloudscale: the API rejected the token ({_token_line(config)}): {exc}"],
        )
        return EXIT_INVALID
    except CloudError as exc:
        _print_errors(
            f"online check against {url} failed",
            [f"cloudscale.url: the API is unreachable or failing: {exc}"],
        )
        return EXIT_INVALID
    errors = catalogue_errors(config.node_groups, flavors, images, regions)
    errors += interface_errors(config.node_groups, networks, subnets)
    if errors:
        _print_errors(f"online check against {url}", errors)
        return EXIT_INVALID
    print(
        f"online check against {url}: OK ({_count(len(flavors), 'flavor')}, "
        f"{_count(len(images), 'image')}, zones {_known([z for r in regions for z in r.zones])})"
    )
    return EXIT_OK
