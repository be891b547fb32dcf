"""The CloudProvider gRPC service: RPC messages <-> engine calls, engine errors -> status codes."""

from __future__ import annotations

import grpc

from cloudscale_autoscaler.config import Config
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc

SERVICE_NAME = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"


class CloudProviderService(pb_grpc.CloudProviderServicer):
    def __init__(self, config: Config) -> None:
        self._config = config
        self._node_groups = pb.NodeGroupsResponse(
            nodeGroups=[
                pb.NodeGroup(id=g.name, minSize=g.min_size, maxSize=g.max_size)
                for g in config.node_groups
            ]
        )

    async def NodeGroups(
        self, request: pb.NodeGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.NodeGroupsResponse:
        return self._node_groups

    async def Cleanup(
        self, request: pb.CleanupRequest, context: grpc.aio.ServicerContext
    ) -> pb.CleanupResponse:
        # CA calls Cleanup when it shuts down; we hold no per-client resources.
        return pb.CleanupResponse()
