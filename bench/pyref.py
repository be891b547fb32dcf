"""`python -m bench.pyref`: the Python floor, a bare grpc.aio CloudProvider server.

It answers NodeGroupForNode, NodeGroupTargetSize, NodeGroupGetOptions and
NodeGroupTemplateNodeInfo (the Go reference's small template node) from the same state file as
the Go reference (bench/go/cmd/goref), over the same mTLS, with no interceptors, no
engine and no logging: what any grpcio-based Python provider pays per call before its own
code runs. The benchmark reports it next to our server and the Go reference, so the gap to Go
splits into the framework's share and ours.

    python -m bench.pyref --listen 127.0.0.1:PORT --state goref-state.json \\
        --cert server.crt --key server.key --ca ca.crt
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import grpc

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.protos.k8s.apimachinery import meta_v1_pb2

NANOS = 1_000_000_000
NOT_MANAGED = pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup())


def _seconds(override: float | None, fallback: Any) -> int:
    """Nanoseconds from an override in seconds, else from a google.protobuf.Duration."""
    if override is not None:
        return int(override * NANOS)
    return int(fallback.seconds) * NANOS + int(fallback.nanos)


def merge(options: dict[str, Any], defaults: pb.NodeGroupAutoscalingOptions) -> Any:
    """Every field from the overrides or the defaults, both generations of durations."""
    unneeded = _seconds(options.get("scaleDownUnneededTime"), defaults.scaleDownUnneededDuration)
    unready = _seconds(options.get("scaleDownUnreadyTime"), defaults.scaleDownUnreadyDuration)
    provision = _seconds(options.get("maxNodeProvisionTime"), defaults.MaxNodeProvisionDuration)
    merged = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=options.get(
            "scaleDownUtilizationThreshold", defaults.scaleDownUtilizationThreshold
        ),
        scaleDownGpuUtilizationThreshold=options.get(
            "scaleDownGpuUtilizationThreshold", defaults.scaleDownGpuUtilizationThreshold
        ),
        scaleDownUnneededTime=meta_v1_pb2.Duration(duration=unneeded),
        scaleDownUnreadyTime=meta_v1_pb2.Duration(duration=unready),
        MaxNodeProvisionTime=meta_v1_pb2.Duration(duration=provision),
        zeroOrMaxNodeScaling=options.get("zeroOrMaxNodeScaling", defaults.zeroOrMaxNodeScaling),
        ignoreDaemonSetsUtilization=options.get(
            "ignoreDaemonSetsUtilization", defaults.ignoreDaemonSetsUtilization
        ),
    )
    merged.scaleDownUnneededDuration.FromNanoseconds(unneeded)
    merged.scaleDownUnreadyDuration.FromNanoseconds(unready)
    merged.MaxNodeProvisionDuration.FromNanoseconds(provision)
    return merged


class BareProvider(pb_grpc.CloudProviderServicer):
    def __init__(self, state: dict[str, Any]) -> None:
        self.groups = {group["id"]: group for group in state["groups"]}
        answers = {
            gid: pb.NodeGroupForNodeResponse(
                nodeGroup=pb.NodeGroup(id=gid, minSize=g["minSize"], maxSize=g["maxSize"])
            )
            for gid, g in self.groups.items()
        }
        self.for_node = {pid: answers[gid] for pid, gid in state["nodes"].items()}
        self.templates = {gid: _template(gid) for gid in self.groups}

    async def NodeGroupForNode(self, request: Any, context: Any) -> Any:
        return self.for_node.get(request.node.providerID, NOT_MANAGED)

    async def NodeGroupTargetSize(self, request: Any, context: Any) -> Any:
        group: Any = self.groups.get(request.id)  # context.abort raises
        if group is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node group {request.id!r}")
        return pb.NodeGroupTargetSizeResponse(targetSize=group["targetSize"])

    async def NodeGroupTemplateNodeInfo(self, request: Any, context: Any) -> Any:
        template = self.templates.get(request.id)
        if template is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node group {request.id!r}")
        return template

    async def NodeGroupGetOptions(self, request: Any, context: Any) -> Any:
        group: Any = self.groups.get(request.id)  # context.abort raises
        if group is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node group {request.id!r}")
        if group["options"] is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no autoscalingOptions")
        return pb.NodeGroupAutoscalingOptionsResponse(
            nodeGroupAutoscalingOptions=merge(group["options"], request.defaults)
        )


def _template(group_id: str) -> pb.NodeGroupTemplateNodeInfoResponse:
    """The Go reference's template node (goref's templateAnswer), in both fields."""
    node = core_v1_pb2.Node()
    node.metadata.name = f"template-{group_id}"
    node.metadata.labels.update({"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"})
    for name, value in (("cpu", "3950m"), ("memory", "3500Mi"), ("pods", "110")):
        node.status.capacity[name].string = value
        node.status.allocatable[name].string = value
    return pb.NodeGroupTemplateNodeInfoResponse(nodeInfo=node, nodeBytes=node.SerializeToString())


async def serve(listen: str, provider: BareProvider, credentials: grpc.ServerCredentials) -> None:
    server = grpc.aio.server()
    pb_grpc.add_CloudProviderServicer_to_server(provider, server)  # type: ignore[no-untyped-call]
    server.add_secure_port(listen, credentials)
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pyref", description=__doc__)
    parser.add_argument("--listen", required=True, help="127.0.0.1:PORT")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--ca", type=Path, required=True)
    args = parser.parse_args(argv)
    credentials = grpc.ssl_server_credentials(
        [(args.key.read_bytes(), args.cert.read_bytes())],
        root_certificates=args.ca.read_bytes(),
        require_client_auth=True,
    )
    provider = BareProvider(json.loads(args.state.read_text()))
    asyncio.run(serve(args.listen, provider, credentials))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
