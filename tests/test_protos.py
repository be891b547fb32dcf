"""The generated protobuf code is fresh, and our descriptors match the externalgrpc contract.

The expected tables below are written out by hand from the upstream proto, kubernetes/autoscaler
cluster-autoscaler/cloudprovider/externalgrpc/protos/externalgrpc.proto
(field names, numbers, types as the upstream Cluster Autoscaler sends and reads them) and
Kubernetes' generated.proto for the k8s messages it imports; they are
deliberately NOT derived from proto/, so a typo in our .proto fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, FileDescriptor

from cloudscale_autoscaler.protos import externalgrpc_pb2
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.protos.k8s.apimachinery import meta_v1_pb2, resource_pb2

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "src" / "cloudscale_autoscaler" / "protos"

EG = "clusterautoscaler.cloudprovider.v1.externalgrpc"
CORE = "k8s.io.api.core.v1"
META = "k8s.io.apimachinery.pkg.apis.meta.v1"
QUANTITY = "k8s.io.apimachinery.pkg.api.resource.Quantity"
TIME = f"{META}.Time"
DURATION = f"{META}.Duration"
PB_TIMESTAMP = "google.protobuf.Timestamp"
PB_DURATION = "google.protobuf.Duration"
NODE = f"{EG}.ExternalGrpcNode"
OPTIONS = f"{EG}.NodeGroupAutoscalingOptions"
RESOURCES = f"{CORE}.ResourceRequirements"

Fields = list[tuple[str, int, str]]

EXPECTED_MESSAGES: dict[str, Fields] = {
    f"{EG}.NodeGroup": [
        ("id", 1, "string"),
        ("minSize", 2, "int32"),
        ("maxSize", 3, "int32"),
        ("debug", 4, "string"),
    ],
    NODE: [
        ("providerID", 1, "string"),
        ("name", 2, "string"),
        ("labels", 3, "map<string,string>"),
        ("annotations", 4, "map<string,string>"),
    ],
    f"{EG}.NodeGroupsRequest": [],
    f"{EG}.NodeGroupsResponse": [("nodeGroups", 1, f"repeated {EG}.NodeGroup")],
    f"{EG}.NodeGroupForNodeRequest": [("node", 1, NODE)],
    f"{EG}.NodeGroupForNodeResponse": [("nodeGroup", 1, f"{EG}.NodeGroup")],
    f"{EG}.PricingNodePriceRequest": [
        ("node", 1, NODE),
        ("startTime", 2, TIME),
        ("endTime", 3, TIME),
        ("startTimestamp", 4, PB_TIMESTAMP),
        ("endTimestamp", 5, PB_TIMESTAMP),
    ],
    f"{EG}.PricingNodePriceResponse": [("price", 1, "double")],
    f"{EG}.PricingPodPriceRequest": [
        ("pod", 1, f"{CORE}.Pod"),
        ("startTime", 2, TIME),
        ("endTime", 3, TIME),
        ("pod_bytes", 4, "bytes"),
        ("startTimestamp", 5, PB_TIMESTAMP),
        ("endTimestamp", 6, PB_TIMESTAMP),
    ],
    f"{EG}.PricingPodPriceResponse": [("price", 1, "double")],
    f"{EG}.GPULabelRequest": [],
    f"{EG}.GPULabelResponse": [("label", 1, "string")],
    f"{EG}.GetAvailableGPUTypesRequest": [],
    f"{EG}.GetAvailableGPUTypesResponse": [("gpuTypes", 1, "map<string,google.protobuf.Any>")],
    f"{EG}.CleanupRequest": [],
    f"{EG}.CleanupResponse": [],
    f"{EG}.RefreshRequest": [],
    f"{EG}.RefreshResponse": [],
    f"{EG}.NodeGroupTargetSizeRequest": [("id", 1, "string")],
    f"{EG}.NodeGroupTargetSizeResponse": [("targetSize", 1, "int32")],
    f"{EG}.NodeGroupIncreaseSizeRequest": [("delta", 1, "int32"), ("id", 2, "string")],
    f"{EG}.NodeGroupIncreaseSizeResponse": [],
    f"{EG}.NodeGroupDeleteNodesRequest": [
        ("nodes", 1, f"repeated {NODE}"),
        ("id", 2, "string"),
    ],
    f"{EG}.NodeGroupDeleteNodesResponse": [],
    f"{EG}.NodeGroupDecreaseTargetSizeRequest": [("delta", 1, "int32"), ("id", 2, "string")],
    f"{EG}.NodeGroupDecreaseTargetSizeResponse": [],
    f"{EG}.NodeGroupNodesRequest": [("id", 1, "string")],
    f"{EG}.NodeGroupNodesResponse": [("instances", 1, f"repeated {EG}.Instance")],
    f"{EG}.Instance": [("id", 1, "string"), ("status", 2, f"{EG}.InstanceStatus")],
    f"{EG}.InstanceStatus": [
        ("instanceState", 1, f"enum {EG}.InstanceStatus.InstanceState"),
        ("errorInfo", 2, f"{EG}.InstanceErrorInfo"),
    ],
    f"{EG}.InstanceErrorInfo": [
        ("errorCode", 1, "string"),
        ("errorMessage", 2, "string"),
        ("instanceErrorClass", 3, "int32"),
    ],
    f"{EG}.NodeGroupTemplateNodeInfoRequest": [("id", 1, "string")],
    f"{EG}.NodeGroupTemplateNodeInfoResponse": [
        ("nodeInfo", 1, f"{CORE}.Node"),
        ("nodeBytes", 2, "bytes"),
        # Beyond the reference table: upstream's current proto adds ResourceSlices (DRA).
        ("resourceSliceBytes", 3, "repeated bytes"),
    ],
    OPTIONS: [
        ("scaleDownUtilizationThreshold", 1, "double"),
        ("scaleDownGpuUtilizationThreshold", 2, "double"),
        ("scaleDownUnneededTime", 3, DURATION),
        ("scaleDownUnreadyTime", 4, DURATION),
        ("MaxNodeProvisionTime", 5, DURATION),
        ("zeroOrMaxNodeScaling", 6, "bool"),
        ("ignoreDaemonSetsUtilization", 7, "bool"),
        ("scaleDownUnneededDuration", 8, PB_DURATION),
        ("scaleDownUnreadyDuration", 9, PB_DURATION),
        ("MaxNodeProvisionDuration", 10, PB_DURATION),
        # Beyond the reference table: in upstream's current proto (CA 1.35+ reads them).
        ("maxNodeStartupDuration", 11, PB_DURATION),
        ("allowNonAtomicScaleUpToMax", 12, "bool"),
    ],
    f"{EG}.NodeGroupAutoscalingOptionsRequest": [("id", 1, "string"), ("defaults", 2, OPTIONS)],
    f"{EG}.NodeGroupAutoscalingOptionsResponse": [("nodeGroupAutoscalingOptions", 1, OPTIONS)],
    # k8s.io.api.core.v1 (proto2)
    f"{CORE}.Node": [
        ("metadata", 1, f"{META}.ObjectMeta"),
        ("spec", 2, f"{CORE}.NodeSpec"),
        ("status", 3, f"{CORE}.NodeStatus"),
    ],
    f"{CORE}.NodeSpec": [
        ("podCIDR", 1, "string"),
        ("externalID", 2, "string"),
        ("providerID", 3, "string"),
        ("unschedulable", 4, "bool"),
        ("taints", 5, f"repeated {CORE}.Taint"),
        ("podCIDRs", 7, "repeated string"),
    ],
    f"{CORE}.Taint": [
        ("key", 1, "string"),
        ("value", 2, "string"),
        ("effect", 3, "string"),
        ("timeAdded", 4, TIME),
    ],
    f"{CORE}.NodeStatus": [
        ("capacity", 1, f"map<string,{QUANTITY}>"),
        ("allocatable", 2, f"map<string,{QUANTITY}>"),
        ("phase", 3, "string"),
        ("conditions", 4, f"repeated {CORE}.NodeCondition"),
        ("addresses", 5, f"repeated {CORE}.NodeAddress"),
        ("nodeInfo", 7, f"{CORE}.NodeSystemInfo"),
    ],
    f"{CORE}.NodeCondition": [
        ("type", 1, "string"),
        ("status", 2, "string"),
        ("lastHeartbeatTime", 3, TIME),
        ("lastTransitionTime", 4, TIME),
        ("reason", 5, "string"),
        ("message", 6, "string"),
    ],
    # Not itemised in the reference; numbers from Kubernetes' generated.proto.
    f"{CORE}.NodeAddress": [("type", 1, "string"), ("address", 2, "string")],
    f"{CORE}.NodeSystemInfo": [
        ("machineID", 1, "string"),
        ("systemUUID", 2, "string"),
        ("bootID", 3, "string"),
        ("kernelVersion", 4, "string"),
        ("osImage", 5, "string"),
        ("containerRuntimeVersion", 6, "string"),
        ("kubeletVersion", 7, "string"),
        ("kubeProxyVersion", 8, "string"),
        ("operatingSystem", 9, "string"),
        ("architecture", 10, "string"),
    ],
    f"{CORE}.Pod": [
        ("metadata", 1, f"{META}.ObjectMeta"),
        ("spec", 2, f"{CORE}.PodSpec"),
        ("status", 3, f"{CORE}.PodStatus"),
    ],
    f"{CORE}.PodSpec": [
        ("containers", 2, f"repeated {CORE}.Container"),
        ("nodeSelector", 7, "map<string,string>"),
        ("initContainers", 20, f"repeated {CORE}.Container"),
        ("overhead", 32, f"map<string,{QUANTITY}>"),
        ("resources", 40, RESOURCES),
    ],
    f"{CORE}.PodStatus": [("phase", 1, "string")],
    f"{CORE}.Container": [
        ("name", 1, "string"),
        ("image", 2, "string"),
        ("resources", 8, RESOURCES),
        ("restartPolicy", 24, "string"),
    ],
    RESOURCES: [
        ("limits", 1, f"map<string,{QUANTITY}>"),
        ("requests", 2, f"map<string,{QUANTITY}>"),
    ],
    # k8s.io.apimachinery (proto2)
    TIME: [("seconds", 1, "int64"), ("nanos", 2, "int32")],
    DURATION: [("duration", 1, "int64")],
    f"{META}.ObjectMeta": [
        ("name", 1, "string"),
        ("generateName", 2, "string"),
        ("namespace", 3, "string"),
        ("uid", 5, "string"),
        ("creationTimestamp", 8, TIME),
        ("labels", 11, "map<string,string>"),
        ("annotations", 12, "map<string,string>"),
    ],
    QUANTITY: [("string", 1, "string")],
}

EXPECTED_ENUMS = {
    f"{EG}.InstanceStatus.InstanceState": [
        ("unspecified", 0),
        ("instanceRunning", 1),
        ("instanceCreating", 2),
        ("instanceDeleting", 3),
    ],
}

# rpc -> (request, response), without the package prefix
EXPECTED_RPCS = {
    "NodeGroups": ("NodeGroupsRequest", "NodeGroupsResponse"),
    "NodeGroupForNode": ("NodeGroupForNodeRequest", "NodeGroupForNodeResponse"),
    "PricingNodePrice": ("PricingNodePriceRequest", "PricingNodePriceResponse"),
    "PricingPodPrice": ("PricingPodPriceRequest", "PricingPodPriceResponse"),
    "GPULabel": ("GPULabelRequest", "GPULabelResponse"),
    "GetAvailableGPUTypes": ("GetAvailableGPUTypesRequest", "GetAvailableGPUTypesResponse"),
    "Cleanup": ("CleanupRequest", "CleanupResponse"),
    "Refresh": ("RefreshRequest", "RefreshResponse"),
    "NodeGroupTargetSize": ("NodeGroupTargetSizeRequest", "NodeGroupTargetSizeResponse"),
    "NodeGroupIncreaseSize": ("NodeGroupIncreaseSizeRequest", "NodeGroupIncreaseSizeResponse"),
    "NodeGroupDeleteNodes": ("NodeGroupDeleteNodesRequest", "NodeGroupDeleteNodesResponse"),
    "NodeGroupDecreaseTargetSize": (
        "NodeGroupDecreaseTargetSizeRequest",
        "NodeGroupDecreaseTargetSizeResponse",
    ),
    "NodeGroupNodes": ("NodeGroupNodesRequest", "NodeGroupNodesResponse"),
    "NodeGroupTemplateNodeInfo": (
        "NodeGroupTemplateNodeInfoRequest",
        "NodeGroupTemplateNodeInfoResponse",
    ),
    "NodeGroupGetOptions": (
        "NodeGroupAutoscalingOptionsRequest",
        "NodeGroupAutoscalingOptionsResponse",
    ),
}

OUR_FILES: list[FileDescriptor] = [
    externalgrpc_pb2.DESCRIPTOR,
    core_v1_pb2.DESCRIPTOR,
    meta_v1_pb2.DESCRIPTOR,
    resource_pb2.DESCRIPTOR,
]

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_SINT32: "sint32",
    FieldDescriptor.TYPE_SINT64: "sint64",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "float",
}


def _base_type(field: FieldDescriptor) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return str(field.message_type.full_name)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return f"enum {field.enum_type.full_name}"
    return _SCALARS[field.type]


def describe(field: FieldDescriptor) -> str:
    """'string', 'repeated X', 'map<K,V>', 'enum E' or a message's full name."""
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        key, value = message.fields_by_name["key"], message.fields_by_name["value"]
        return f"map<{_base_type(key)},{_base_type(value)}>"
    return ("repeated " if field.is_repeated else "") + _base_type(field)


def _messages(container: FileDescriptor | Descriptor) -> list[Descriptor]:
    found: list[Descriptor] = []
    children = (
        container.message_types_by_name.values()
        if isinstance(container, FileDescriptor)
        else container.nested_types
    )
    for message in children:
        if message.GetOptions().map_entry:
            continue  # synthesized for map<K,V> fields, checked through the field
        found.append(message)
        found.extend(_messages(message))
    return found


def _enums(files: list[FileDescriptor]) -> list[EnumDescriptor]:
    enums: list[EnumDescriptor] = []
    for file in files:
        enums.extend(file.enum_types_by_name.values())
        for message in _messages(file):
            enums.extend(message.enum_types)
    return enums


ACTUAL_MESSAGES = {m.full_name: m for f in OUR_FILES for m in _messages(f)}


def test_no_message_missing_or_extra() -> None:
    assert sorted(ACTUAL_MESSAGES) == sorted(EXPECTED_MESSAGES)


@pytest.mark.parametrize("name", sorted(EXPECTED_MESSAGES))
def test_message_fields(name: str) -> None:
    message = ACTUAL_MESSAGES.get(name)
    assert message is not None, f"{name} is not in our protos"
    actual = [(f.name, f.number, describe(f)) for f in message.fields]
    assert sorted(actual, key=lambda f: f[1]) == sorted(EXPECTED_MESSAGES[name], key=lambda f: f[1])


def test_enums() -> None:
    actual = {e.full_name: [(v.name, v.number) for v in e.values] for e in _enums(OUR_FILES)}
    assert actual == EXPECTED_ENUMS


def test_service_methods() -> None:
    service = externalgrpc_pb2.DESCRIPTOR.services_by_name["CloudProvider"]
    assert service.full_name == f"{EG}.CloudProvider"
    actual = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in service.methods}
    expected = {rpc: (f"{EG}.{req}", f"{EG}.{resp}") for rpc, (req, resp) in EXPECTED_RPCS.items()}
    assert actual == expected
    assert not any(m.client_streaming or m.server_streaming for m in service.methods)


def test_k8s_files_are_proto2() -> None:
    # proto2 keeps field presence, as Kubernetes' own generated.proto does: an unset optional
    # string is absent on the wire rather than encoded as "".
    assert _syntax(externalgrpc_pb2.DESCRIPTOR) == "proto3"
    for file in OUR_FILES[1:]:
        assert _syntax(file) == "proto2", file.name


def _syntax(file: FileDescriptor) -> str:
    # FileDescriptorProto leaves `syntax` empty for proto2.
    return descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb).syntax or "proto2"


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    out = tmp_path / "protos"
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "genproto.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    fresh, committed = _tree(out), _tree(GENERATED)
    assert sorted(fresh) == sorted(committed), "run `python tools/genproto.py`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}: run `python tools/genproto.py`"
