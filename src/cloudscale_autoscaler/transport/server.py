"""The grpc.aio server: CloudProvider, health, reflection, mTLS, interceptors, graceful stop.

Message size: the receive limit is raised from gRPC's 4 MiB to 16 MiB because CA's
NodeGroupDeleteNodes carries whole node objects (labels, annotations) and can list thousands
of them in one call; anything larger is refused with RESOURCE_EXHAUSTED.

Shutdown: `RunningServer.stop(grace)` marks every health entry NOT_SERVING, stops accepting
new RPCs and gives in-flight ones `grace` seconds (default 25 s, inside Kubernetes' default
30 s termination grace period) before cancelling them.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from cloudscale_autoscaler.config import Config
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.service.provider import SERVICE_NAME
from cloudscale_autoscaler.transport.interceptors import (
    AllowedClientsInterceptor,
    Context,
    MalformedRequestInterceptor,
    RequestLogInterceptor,
)
from cloudscale_autoscaler.transport.tls import DEFAULT_MIN_INTERVAL, ReloadingCredentials

log = logging.getLogger(__name__)

MAX_RECEIVE_BYTES = 16 * 1024 * 1024
DEFAULT_GRACE_SECONDS = 25.0
HEALTH_SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
RPC_NAMES: tuple[str, ...] = tuple(
    m.name for m in pb.DESCRIPTOR.services_by_name["CloudProvider"].methods
)
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    # gRPC sets SO_REUSEPORT by default: a second instance on the same port would silently
    # share it instead of failing to start.
    ("grpc.so_reuseport", 0),
]


class ListenError(Exception):
    """The configured listen address cannot be bound."""


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: HealthServicer
    # None when serving plaintext (tls.insecure).
    credentials: ReloadingCredentials | None

    def cert_not_after(self) -> float | None:
        """notAfter (Unix time) of the certificate new connections get; None without TLS."""
        return None if self.credentials is None else self.credentials.not_after()

    async def stop(self, grace: float | None = DEFAULT_GRACE_SECONDS) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        log.info("gRPC server stopped")


def _unimplemented(name: str) -> Any:
    message = f"{name} is not implemented by cloudscale-autoscaler"

    async def answer(request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

    return answer


def routes(servicer: pb_grpc.CloudProviderServicer) -> Any:
    """What the generated registration code gets instead of the servicer itself: the servicer's
    methods, except that an RPC it does not override answers UNIMPLEMENTED naming the RPC
    (the generated base class would answer with a generic, unnamed message)."""
    base = pb_grpc.CloudProviderServicer
    table = types.SimpleNamespace()
    for name in RPC_NAMES:
        own = getattr(type(servicer), name, None)
        overridden = own is not None and own is not getattr(base, name)
        setattr(table, name, getattr(servicer, name) if overridden else _unimplemented(name))
    return table


def _interceptors(config: Config) -> list[grpc.aio.ServerInterceptor[Any, Any]]:
    chain: list[grpc.aio.ServerInterceptor[Any, Any]] = [RequestLogInterceptor()]
    allowed = config.tls.allowed_clients
    if allowed and config.tls.insecure:
        log.warning("tls.allowedClients is ignored: tls.insecure serves without certificates")
    elif allowed:
        chain.append(AllowedClientsInterceptor(allowed, services=[SERVICE_NAME]))
    return chain


def _credentials(config: Config, reload_interval: float) -> ReloadingCredentials | None:
    if config.tls.insecure:
        return None
    tls = config.tls
    if tls.cert is None or tls.key is None or tls.client_ca is None:
        raise ValueError("tls: cert, key and clientCA are required unless tls.insecure is true")
    return ReloadingCredentials(tls.cert, tls.key, tls.client_ca, min_interval=reload_interval)


def _bind(server: grpc.aio.Server, listen: str, credentials: ReloadingCredentials | None) -> int:
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials.server_credentials())
    except RuntimeError as exc:
        raise ListenError(f"listen {listen!r}: cannot bind ({exc})") from None
    if port == 0:  # older gRPC releases report failure this way
        raise ListenError(f"listen {listen!r}: cannot bind (address in use or invalid)")
    return port


async def start_server(
    config: Config,
    servicer: pb_grpc.CloudProviderServicer,
    *,
    listen: str | None = None,
    reload_interval: float = DEFAULT_MIN_INTERVAL,
    interceptors: Sequence[grpc.aio.ServerInterceptor[Any, Any]] = (),
    extra_options: Sequence[tuple[str, Any]] = (),
) -> RunningServer:
    """Bind `listen` (default config.listen; port 0 picks a free one) and start serving.

    `interceptors` run inside ours (after the request id is set and the client admitted),
    e.g. for metrics.

    Raises TLSFileError (bad certificate files), ListenError or ValueError (TLS not configured).
    """
    address = listen if listen is not None else config.listen
    credentials = _credentials(config, reload_interval)
    server = grpc.aio.server(
        interceptors=[*_interceptors(config), *interceptors, MalformedRequestInterceptor()],
        options=[*SERVER_OPTIONS, *extra_options],
    )
    pb_grpc.add_CloudProviderServicer_to_server(routes(servicer), server)  # type: ignore[no-untyped-call]
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = _bind(server, address, credentials)
    if credentials is None:
        log.warning(
            "SERVING gRPC WITHOUT TLS (tls.insecure: true): anyone who can reach %s can "
            "create and delete servers. Use this only for local development.",
            address,
        )
    await server.start()
    for service in ("", SERVICE_NAME):
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC server listening", extra={"listen": address, "port": port})
    return RunningServer(server, port, health, credentials)
