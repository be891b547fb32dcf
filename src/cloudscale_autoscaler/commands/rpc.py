"""`cloudscale-autoscaler rpc --cloud-config FILE METHOD [JSON]`: call one of the 15
CloudProvider RPCs by hand, as the Cluster Autoscaler would, and print the answer as JSON.

The connection is CA's: the address, client certificate, key, CA bundle and per-call timeout
come from CA's own cloud-config file (`address`, `cert`, `key`, `cacert`, `grpc_timeout`;
relative paths against the file's directory), so a call that works here works for CA. The
request is JSON in the proto's field names (`{"id": "workers", "delta": 1}`); `--group` fills
`id`, and `--node` fills the node of NodeGroupForNode and appends to DeleteNodes' `nodes` from a
providerID (`cloudscale://<uuid>`), a bare server UUID or a server name (looked up in the API
with the provider's `--config`, as CA would send the Node: its providerID and name).

grpcio is already a dependency of the package (the demo's client): no tool to install.
Exit codes: 0 the call succeeded; 1 it answered an error (printed as `CODE: message`);
2 bad arguments, files or request.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

from cloudscale_autoscaler.cloud.errors import CloudError
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.config.values import parse_go_duration, uuid_error
from cloudscale_autoscaler.engine.providerid import PREFIX, format_provider_id
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.service.provider import SERVICE_NAME
from cloudscale_autoscaler.settings.types import ConfigError

EXIT_OK = 0
EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
# CA's default per-call timeout, when the cloud-config sets no grpc_timeout.
DEFAULT_TIMEOUT = "5s"
SERVICE = pb.DESCRIPTOR.services_by_name["CloudProvider"]
METHODS: dict[str, MethodDescriptor] = {m.name: m for m in SERVICE.methods}


class UsageError(Exception):
    """Bad arguments, files or request: said in one line, exit 2."""


@dataclass(frozen=True)
class CloudConfig:
    """What CA's cloud-config tells a client: where, with which certificates, how long."""

    address: str
    cert: bytes
    key: bytes
    cacert: bytes
    timeout_seconds: float


def read_cloud_config(path: Path) -> CloudConfig:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read the cloud-config: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected CA's cloud-config, a mapping with address and cert")
    missing = [key for key in ("address", "cert", "key", "cacert") if not doc.get(key)]
    if missing:
        raise UsageError(f"{path}: missing {', '.join(missing)} (CA's externalgrpc cloud-config)")
    try:
        timeout = parse_go_duration(str(doc.get("grpc_timeout", DEFAULT_TIMEOUT)))
    except ValueError as exc:
        raise UsageError(f"{path}: grpc_timeout: {exc}") from None
    files = {key: _read(path.parent / str(doc[key]), key) for key in ("cert", "key", "cacert")}
    return CloudConfig(str(doc["address"]), timeout_seconds=timeout, **files)


def _read(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def build_request(
    method: MethodDescriptor,
    body: str | None,
    group: str | None,
    nodes: list[pb.ExternalGrpcNode],
) -> Message:
    request = message_factory.GetMessageClass(method.input_type)()
    try:
        json_format.Parse(body or "{}", request)
    except json_format.ParseError as exc:
        raise UsageError(f"{method.name} request: {exc}") from None
    fields = method.input_type.fields_by_name
    if group is not None:
        if "id" not in fields:
            raise UsageError(f"--group: {method.name} takes no node group id")
        request.id = group  # type: ignore[attr-defined]
    for node in nodes:
        if "node" in fields:
            request.node.CopyFrom(node)  # type: ignore[attr-defined]
        elif "nodes" in fields:
            request.nodes.append(node)  # type: ignore[attr-defined]
        else:
            raise UsageError(f"--node: {method.name} takes no node")
    return request


async def node_shapes(written: list[str], config: Path | None) -> list[pb.ExternalGrpcNode]:
    """The ExternalGrpcNode CA sends for each `--node`: providerID and name."""
    if not written:
        return []
    named = [node for node in written if not _is_id(node)]
    servers = await _servers_by_name(config) if named else {}
    shapes = []
    for node in written:
        if node.startswith(PREFIX):  # as given: a placeholder's id too
            shapes.append(pb.ExternalGrpcNode(providerID=node))
        elif uuid_error(node) is None:
            shapes.append(pb.ExternalGrpcNode(providerID=format_provider_id(node)))
        elif node in servers:
            shapes.append(
                pb.ExternalGrpcNode(providerID=format_provider_id(servers[node]), name=node)
            )
        else:
            raise UsageError(f"--node {node}: no server of the cluster is named {node!r}")
    return shapes


def _is_id(node: str) -> bool:
    return node.startswith(PREFIX) or uuid_error(node) is None


async def _servers_by_name(config_path: Path | None) -> dict[str, str]:
    if config_path is None:
        raise UsageError(
            "--node with a server name needs --config (the provider's config) to look up its "
            "providerID; or give cloudscale://<uuid>"
        )
    from cloudscale_autoscaler.cloud.client import CloudscaleClient

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise UsageError(f"--config {config_path}: invalid: {'; '.join(exc.errors)}") from None
    try:
        async with CloudscaleClient.from_config(config.cloudscale) as client:
            servers = await client.list_servers(config.cluster)
    except CloudError as exc:
        raise UsageError(f"--node: listing the servers of {config.cluster} failed: {exc}") from None
    return {server.name: server.uuid for server in servers}


async def call(cloud: CloudConfig, method: MethodDescriptor, request: Message) -> Message:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=cloud.cacert, private_key=cloud.key, certificate_chain=cloud.cert
    )
    response_class = message_factory.GetMessageClass(method.output_type)
    async with grpc.aio.secure_channel(cloud.address, credentials) as channel:
        stub = channel.unary_unary(
            f"/{SERVICE_NAME}/{method.name}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        response: Message = await stub(request, timeout=cloud.timeout_seconds)
        return response


def as_json(response: Message) -> str:
    data: dict[str, Any] = json_format.MessageToDict(response)
    return json.dumps(data, indent=2, sort_keys=True)


async def _rpc(args: RpcArgs) -> int:
    method = METHODS.get(args.method)
    if method is None:
        raise UsageError(f"unknown method {args.method!r}; expected one of {', '.join(METHODS)}")
    cloud = read_cloud_config(args.cloud_config)
    nodes = await node_shapes(args.nodes, args.config)
    request = build_request(method, args.body, args.group, nodes)
    try:
        response = await call(cloud, method, request)
    except grpc.aio.AioRpcError as exc:
        print(f"rpc {method.name}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_RPC_ERROR
    print(as_json(response))
    return EXIT_OK


@dataclass(frozen=True)
class RpcArgs:
    cloud_config: Path
    method: str
    body: str | None
    group: str | None
    nodes: list[str]
    config: Path | None


def rpc_command(args: RpcArgs) -> int:
    try:
        return asyncio.run(_rpc(args))
    except UsageError as exc:
        print(f"rpc: {exc}", file=sys.stderr)
        return EXIT_USAGE
