"""The gRPC server: the compiled transport (`cloudscale_autoscaler._transport`, rust/) wired to
the servicer, the TLS files, allowedClients, logging and metrics.

The transport owns the port: CloudProvider, grpc health and reflection, mutual TLS (rustls).
It answers NodeGroups, NodeGroupForNode, NodeGroupTargetSize, NodeGroupGetOptions,
NodeGroupTemplateNodeInfo and GPULabel from answers Python publishes (`RunningServer.publish_*`,
see service/hot.py), or from the answers Python gave before to the same request bytes where
Python declared an RPC's answers a pure function of the request (`memoize`), and forwards every
other call, and every call it has no answer for, to `calls.Calls` on the event loop. A
forwarded call other than these six that its caller gave up on (deadline, cancelled) while
Python still runs it turns the prepared answers off until Python has ended it: Python
publishes only then, and CA's next read must see what that call changed.

TLS: Python loads and validates the files (transport/tls.py) and hands the PEM bytes over; the
transport checks the files through `ReloadingCredentials` before a new handshake (at most once per
`reload_interval`, which the transport counts too, so the handshakes in between take no GIL) and
swaps in new material for the connections accepted from then on. rustls refuses TLS below 1.2 and
client certificates whose extended key usage excludes clientAuth (one without that extension is
accepted); each refused handshake is logged with the client's address and rustls' reason
(transport/handshakes.py, at most one line per client address a minute).

Message size: the receive limit is raised from gRPC's 4 MiB to 16 MiB because CA's
NodeGroupDeleteNodes carries whole node objects (labels, annotations) and can list thousands
of them in one call; anything larger is refused with RESOURCE_EXHAUSTED.

Limits: streams per connection, header size, the bytes of requests in flight, how long a request
may take to arrive, idle connections and keepalive pings: see transport/limits.py. The
transport also keeps the gRPC wire rules: a request other than POST gets HTTP 405, one whose
content-type is not application/grpc or application/grpc+proto HTTP 415 (each with grpc-status
INTERNAL), and a compressed message without a grpc-encoding INTERNAL.

Memory: what a burst of requests made the process take is given back to the system
(transport/memory.py).

Shutdown: `RunningServer.stop(grace)` marks every health entry NOT_SERVING, stops accepting
connections and gives in-flight RPCs `grace` seconds (default 25 s, inside Kubernetes' default
30 s termination grace period) before cutting them.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor
from grpc_health.v1 import health_pb2

from cloudscale_autoscaler import _transport
from cloudscale_autoscaler.observability.metrics import RPC_BUCKETS, RpcReading
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.settings.types import Config
from cloudscale_autoscaler.transport.calls import CODE_NAMES, Calls
from cloudscale_autoscaler.transport.clients import AllowedClients
from cloudscale_autoscaler.transport.handshakes import RefusedHandshakes
from cloudscale_autoscaler.transport.limits import DEFAULT_LIMITS, Limits
from cloudscale_autoscaler.transport.memory import trim_after_growth, tune_malloc
from cloudscale_autoscaler.transport.tls import (
    DEFAULT_MIN_INTERVAL,
    ReloadingCredentials,
    TLSMaterial,
)

log = logging.getLogger(__name__)

RPC_NAMES: tuple[str, ...] = tuple(
    m.name for m in pb.DESCRIPTOR.services_by_name["CloudProvider"].methods
)
DEFAULT_GRACE_SECONDS = 25.0


class ListenError(Exception):
    """The configured listen address cannot be bound."""


def descriptor_set() -> bytes:
    """The FileDescriptorSet reflection serves: our protos and health, dependencies first."""
    out = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(file: FileDescriptor) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            add(dependency)
        file.CopyToProto(out.file.add())

    add(pb.DESCRIPTOR)
    add(health_pb2.DESCRIPTOR)
    return out.SerializeToString()


def _pems(material: TLSMaterial) -> tuple[bytes, bytes, bytes]:
    return material.cert_chain, material.key, material.client_ca


@dataclass
class _Hooks:
    """What the transport calls back (attribute names are the transport's contract)."""

    event_loop: asyncio.AbstractEventLoop
    dispatch: Any
    cancel: Any
    log_rpc: Any
    admit: Any
    tls_check: Any
    tls_check_interval: float  # the transport calls tls_check at most this often
    tls_refused: Any


class RunningServer:
    def __init__(
        self,
        config: Config,
        calls: Calls,
        address: str,
        credentials: ReloadingCredentials | None,
        max_connection_age: float | None,
        gated: bool,
        limits: Limits,
    ) -> None:
        self._calls = calls
        self._credentials = credentials
        self._served: TLSMaterial | None = None if credentials is None else credentials.material
        hooks = _Hooks(
            event_loop=asyncio.get_running_loop(),
            dispatch=calls.dispatch,
            cancel=calls.cancel,
            log_rpc=calls.log_rpc,
            admit=_admission(config),
            tls_check=None if credentials is None else self._transport_tls_check,
            tls_check_interval=0.0 if credentials is None else credentials.min_interval,
            tls_refused=None if credentials is None else RefusedHandshakes().refused,
        )
        try:
            self._server = _transport.Server(
                address,
                [method.name for method in calls.methods],
                list(RPC_BUCKETS),
                descriptor_set(),
                None if self._served is None else _pems(self._served),
                hooks,
                secrets.token_hex(3),  # keeps request ids of replicas and restarts apart
                limits,
                max_connection_age,
                not gated,
            )
        except OSError as exc:
            raise ListenError(f"listen {address!r}: {exc}") from None
        self.port: int = self._server.port
        self._stopped: asyncio.Future[None] | None = None
        self._trimming = asyncio.get_running_loop().create_task(trim_after_growth())
        self._server.set_debug(logging.getLogger(Calls.__module__).isEnabledFor(logging.DEBUG))

    def cert_not_after(self) -> float | None:
        """notAfter (Unix time) of the certificate new connections get; None without TLS."""
        if self._credentials is None:
            return None
        self._check_tls_files()
        return self._credentials.material.not_after

    def _transport_tls_check(self) -> None:
        # The transport calls at most once per reload interval by its own clock. Python's
        # interval, counted from a later moment and restarted by every scrape, could answer
        # "not yet" and put the next check a whole interval off: the check is forced here.
        self._check_tls_files(force=True)

    def _check_tls_files(self, *, force: bool = False) -> None:
        """Before a handshake (from the transport) and at scrape time: hand the transport
        the newest valid material once it changed."""
        assert self._credentials is not None
        try:
            self._credentials.refresh(force=force)
            material = self._credentials.material
            if material is not self._served:
                self._server.set_tls(*_pems(material))
                self._served = material
        except Exception:  # a failure here must not fail the handshake that asked
            log.exception("TLS certificate reload failed; keeping the current certificate")

    def set_health(self, service: str, serving: bool) -> None:
        """gRPC health's status of `service` ("" is the whole server)."""
        self._server.set_health(service, serving)

    def serve_until(self, until: float) -> None:
        """Answer from the published answers until this time.monotonic() value (inf: always);
        outside it every call goes to the servicer (leader election's gate)."""
        self._server.set_serving_for(until - time.monotonic())

    def set_after_call(self, after_call: Any) -> None:
        self._calls.after_call = after_call

    def publish_node_index(self, index: Mapping[str, bytes], not_managed: bytes) -> None:
        self._server.publish_node_index(index, not_managed)

    def publish_answers(self, method: str, answers: Mapping[str, bytes | tuple[int, str]]) -> None:
        self._server.publish_answers(method, answers)

    def withdraw(self, method: str) -> None:
        self._server.withdraw(method)

    def memoize(self, method: str) -> None:
        self._server.memoize(method)

    def rpc_readings(self) -> list[RpcReading]:
        readings = []
        for index, method in enumerate(self._calls.methods):
            codes, buckets, seconds = self._server.rpc_stats(index)
            named = {CODE_NAMES[code]: count for code, count in enumerate(codes) if count}
            readings.append(RpcReading(method.name, named, buckets, seconds))
        return readings

    async def stop(self, grace: float | None = DEFAULT_GRACE_SECONDS) -> None:
        """Drain and stop; a second call waits for the first one's drain."""
        if self._stopped is None:
            loop = asyncio.get_running_loop()
            stopped = self._stopped = loop.create_future()

            def done() -> None:
                if not stopped.done():
                    stopped.set_result(None)

            def on_stopped() -> None:  # on the transport's thread
                loop.call_soon_threadsafe(done)

            self._trimming.cancel()
            self._server.stop(grace or 0.0, on_stopped)
            await stopped
            # The transport's thread is returning from on_stopped (a moment): once it has,
            # the process may exit without the thread needing Python again.
            self._server.join()
            self._calls.cancel_all()
            log.info("gRPC server stopped")
        await self._stopped


def _admission(config: Config) -> Any:
    allowed = config.tls.allowed_clients
    if allowed and config.tls.insecure:
        log.warning("tls.allowedClients is ignored: tls.insecure serves without certificates")
        return None
    return AllowedClients(allowed).decide if allowed else None


def _credentials(config: Config, reload_interval: float) -> ReloadingCredentials | None:
    if config.tls.insecure:
        return None
    tls = config.tls
    if tls.cert is None or tls.key is None or tls.client_ca is None:
        raise ValueError("tls: cert, key and clientCA are required unless tls.insecure is true")
    return ReloadingCredentials(tls.cert, tls.key, tls.client_ca, min_interval=reload_interval)


async def start_server(
    config: Config,
    servicer: object,
    *,
    listen: str | None = None,
    reload_interval: float = DEFAULT_MIN_INTERVAL,
    max_connection_age: float | None = None,
    gated: bool = False,
    limits: Limits = DEFAULT_LIMITS,
) -> RunningServer:
    """Bind `listen` (default config.listen; port 0 picks a free one) and start serving.

    Raises TLSFileError (bad certificate files), ListenError or ValueError (TLS not configured,
    or material the TLS library refuses). With `max_connection_age` (seconds), connections
    are sent GOAWAY after that age, their calls in flight finishing. `gated` (leader
    election): the published answers are not served until `serve_until` opens the gate.
    `limits`: what bounds the server under any client (transport/limits.py).
    """
    address = listen if listen is not None else config.listen
    credentials = _credentials(config, reload_interval)
    tune_malloc()  # before the transport's thread allocates
    running = RunningServer(
        config, Calls(servicer), address, credentials, max_connection_age, gated, limits
    )
    if credentials is None:
        log.warning(
            "SERVING gRPC WITHOUT TLS (tls.insecure: true): anyone who can reach %s can "
            "create and delete servers. Use this only for local development.",
            address,
        )
    log.info("gRPC server listening", extra={"listen": address, "port": running.port})
    return running
