"""`cloudscale-autoscaler template GROUP`: print the template Node CA would be given, as YAML/JSON.

The printed object is the same Node the NodeGroupTemplateNodeInfo RPC serves, in the shape
`kubectl get node -o yaml` uses (apiVersion, kind, quantities as strings), so operators can
check what CA will assume about a group before it scales from zero.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.cloud.models import Flavor
from cloudscale_autoscaler.config import Config, ConfigError, NodeGroupConfig
from cloudscale_autoscaler.logs import to_stderr
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.template.node import build_template_node
from cloudscale_autoscaler.template.slug import flavor_from_slug

_QUANTITY = "k8s.io.apimachinery.pkg.api.resource.Quantity"
_TIME = "k8s.io.apimachinery.pkg.apis.meta.v1.Time"
EXIT_USAGE = 2
EXIT_CLOUD = 1
log = logging.getLogger(__name__)


def node_to_dict(node: core_v1_pb2.Node) -> dict[str, Any]:
    """The Node as a Kubernetes JSON object: set fields only, maps sorted, quantities as strings."""
    return {"apiVersion": "v1", "kind": "Node", **_message_to_dict(node)}


def _message_to_dict(message: Message) -> dict[str, Any]:
    return {
        descriptor.name: _field_value(descriptor, value)
        for descriptor, value in message.ListFields()
    }


def _field_value(descriptor: FieldDescriptor, value: Any) -> Any:
    entry = descriptor.message_type
    if descriptor.is_repeated and entry is not None and entry.GetOptions().map_entry:
        value_field = entry.fields_by_name["value"]
        # Sorted like Go's encoders (code point order = UTF-8 byte order for str).
        return {key: _scalar_or_message(value_field, value[key]) for key in sorted(value)}
    if descriptor.is_repeated:
        return [_scalar_or_message(descriptor, item) for item in value]
    return _scalar_or_message(descriptor, value)


def _scalar_or_message(descriptor: FieldDescriptor, value: Any) -> Any:
    if descriptor.type != FieldDescriptor.TYPE_MESSAGE:
        return value
    name = value.DESCRIPTOR.full_name
    if name == _QUANTITY:
        return value.string
    if name == _TIME:  # RFC 3339, second precision, like metav1.Time's JSON form
        moment = datetime.fromtimestamp(value.seconds, tz=UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return _message_to_dict(value)


def render(document: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(document, indent=2) + "\n"
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


async def _fetch_flavors(config: Config) -> list[Flavor]:
    # Imported here so that `template --help` and the pure helpers do not need the HTTP stack.
    from cloudscale_autoscaler.cloud.client import CloudscaleClient

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
    from cloudscale_autoscaler.config import load_config

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
    from cloudscale_autoscaler.config.interfaces import interfaces_text
    from cloudscale_autoscaler.config.pricing import price_text

    price = (
        price_text(config.pricing, group)
        if config.pricing is not None
        else "none (no pricing section: CA's price expander gets UNIMPLEMENTED)"
    )
    return f"# node group {group.name}: interfaces: {interfaces_text(group)}\n# price: {price}"
