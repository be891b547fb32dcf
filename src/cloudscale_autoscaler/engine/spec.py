"""The create request for one new server of a group (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from cloudscale_autoscaler.cloud.models import (
    TAG_CLUSTER,
    TAG_GROUP,
    TAG_REQUEST,
    InterfaceRequest,
    ServerSpec,
)
from cloudscale_autoscaler.settings.types import NodeGroupConfig
from cloudscale_autoscaler.template import userdata


def identity_tags(cluster: str, group: str, request_id: str) -> dict[str, str]:
    return {TAG_CLUSTER: cluster, TAG_GROUP: group, TAG_REQUEST: request_id}


def render_user_data(
    cluster: str, group: NodeGroupConfig, name: str, node_labels: Mapping[str, str]
) -> str | None:
    """`node_labels`: what the template promises that neither the kubelet nor the CCM sets
    (template.labels.label_sources), so the real node carries every template label."""
    if group.user_data is None:
        return None
    values = {
        "node_labels": userdata.format_labels(node_labels.items()),
        "node_taints": userdata.format_taints(group.taints),
        "server_name": name,
        "group": group.name,
        "cluster": cluster,
    }
    return userdata.render(group.user_data, values)


def build_spec(
    cluster: str,
    group: NodeGroupConfig,
    name: str,
    request_id: str,
    node_labels: Mapping[str, str],
    interfaces: tuple[InterfaceRequest, ...] | None = None,
) -> ServerSpec:
    """Raises userdata.UserDataError if the group's template cannot be rendered.
    `interfaces` are the group's interfaces with network names resolved to UUIDs."""
    tags = dict(group.tags)
    # Identity tags last: they win over anything in the group's own tags.
    tags.update(identity_tags(cluster, group.name, request_id))
    return ServerSpec(
        name=name,
        flavor=group.flavor,
        image=group.image,
        zone=group.zone,
        volume_size_gb=group.volume_size_gb,
        ssh_keys=group.ssh_keys,
        server_groups=group.server_groups,
        use_public_network=group.use_public_network,
        use_private_network=group.use_private_network,
        use_ipv6=group.use_ipv6,
        interfaces=interfaces,
        user_data=render_user_data(cluster, group, name, node_labels),
        tags=tags,
    )
