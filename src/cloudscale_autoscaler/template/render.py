"""A template Node as the Kubernetes JSON object (pure): the shape `kubectl get node -o yaml`
uses (apiVersion, kind, set fields only, quantities as strings). The `template` command prints
it; the drift check compares live Nodes with it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2

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
