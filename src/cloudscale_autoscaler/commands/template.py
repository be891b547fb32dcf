"""`cloudscale-autoscaler template GROUP`: print the template Node CA would be given, as YAML/JSON.

The printed object is the same Node the NodeGroupTemplateNodeInfo RPC serves, in the shape
`kubectl get node -o yaml` uses (apiVersion, kind, quantities as strings), so operators can
check what CA will assume about a group before it scales from zero. The flavor comes from the
API, or from its slug when the API does not answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

from cloudscale_autoscaler.cloud.client import CloudscaleClient
from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.config.interfaces import interfaces_text
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.config.pricing import price_text
from cloudscale_autoscaler.observability.logs import to_stderr
from cloudscale_autoscaler.settings.types import Config, ConfigError, NodeGroupConfig
from cloudscale_autoscaler.template.node import build_template_node
from cloudscale_autoscaler.template.render import node_to_dict
from cloudscale_autoscaler.template.slug import flavor_from_slug

EXIT_USAGE = 2
EXIT_CLOUD = 1
log = logging.getLogger(__name__)


def render(document: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(document, indent=2) + "\n"
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


async def _fetch_flavors(config: Config) -> list[Flavor]:
    client = CloudscaleClient.from_config(config.cloudscale)
    try:
        return await client.list_flavors()
    finally:
        await client.aclose()


def _error(message: str) -> None:
    to_stderr(log, logging.ERROR, message, plain_prefix="error: ")


def template_command(config_path: Path, group: str, output: str) -> int:
    """Print the group's template Node; 2 for a bad config/group/flavor, 1 if the API fails
    and the flavor slug does not say the size."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        _error(str(exc))
        return EXIT_USAGE
    group_config = config.group(group)
    if group_config is None:
        names = ", ".join(g.name for g in config.node_groups) or "(none)"
        _error(f'unknown node group "{group}" in {config_path}; configured groups: {names}')
        return EXIT_USAGE
    try:
        flavors = asyncio.run(_fetch_flavors(config))
    except CloudError as exc:
        # Offline (or the API is down): the slug says the size, so the template still prints.
        flavor = flavor_from_slug(group_config.flavor)
        if flavor is None:
            _error(f"cannot list flavors from {config.cloudscale.url}: {exc}")
            return EXIT_CLOUD
        to_stderr(
            log,
            logging.WARNING,
            f"cannot list flavors from {config.cloudscale.url} ({exc}); "
            f'sizes read from the flavor slug "{flavor.slug}"',
            plain_prefix="note: ",
        )
        flavors = [flavor]
    flavor = next((f for f in flavors if f.slug == group_config.flavor), None)
    if flavor is None:
        known = ", ".join(sorted(f.slug for f in flavors)) or "(none)"
        _error(
            f'node group "{group}": flavor "{group_config.flavor}" does not exist at '
            f"{config.cloudscale.url}; available flavors: {known}"
        )
        return EXIT_USAGE
    try:
        node = build_template_node(config.cluster, group_config, flavor, config.gpu_label)
    except ValueError as exc:  # a kubelet reservation the loader let through
        _error(f'node group "{group}": {exc}')
        return EXIT_USAGE
    sys.stdout.write(render(node_to_dict(node), output))
    # What the Node does not show, on stderr so that stdout stays one document.
    to_stderr(log, logging.INFO, group_notes(config, group_config))
    return 0


def group_notes(config: Config, group: NodeGroupConfig) -> str:
    """`# interfaces: ...` and `# price: ...` of the group (the price RPC's hourly basis)."""
    price = (
        price_text(config.pricing, group)
        if config.pricing is not None
        else "none (no pricing section: CA's price expander gets UNIMPLEMENTED)"
    )
    return f"# node group {group.name}: interfaces: {interfaces_text(group)}\n# price: {price}"
