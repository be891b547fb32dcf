"""Server interceptors: request ids with a debug RPC log, and the allowedClients check.

grpc.aio interceptors only see the method name, not the call's context, so both work by
wrapping the method's behaviour; the wrapped handler is built once per method and reused.
Both sit on the hot path (CA calls NodeGroupForNode once per node per loop), so the per-call
cost is a few dict lookups: the allowedClients decision is cached per client identity, and the
RPC log does its timing only when DEBUG is enabled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import grpc

from cloudscale_autoscaler.echo import clip
from cloudscale_autoscaler.logs import request_id_var

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the stubs' generics do not exist at runtime
    Context = grpc.aio.ServicerContext[Any, Any]
    Handler = grpc.RpcMethodHandler[Any, Any]
    Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Context = grpc.aio.ServicerContext
    Handler = grpc.RpcMethodHandler
    Interceptor = grpc.aio.ServerInterceptor
Behavior = Callable[[Any, Context], Awaitable[Any]]
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler]]

# Distinct client identities remembered by the allowedClients cache before it starts over.
MAX_CACHED_IDENTITIES = 1024


class _UnaryWrapper(Interceptor):
    """Wraps the behaviour of unary-unary RPCs; streaming RPCs pass through untouched."""

    def __init__(self) -> None:
        # method -> (handler as found, wrapped handler)
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    def applies_to(self, method: str) -> bool:
        return True

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        raise NotImplementedError

    def deserializer(self, deserialize: Any) -> Any:
        """The request deserializer the wrapped handler uses (by default, the original)."""
        return deserialize

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        if handler is None or handler.unary_unary is None or not self.applies_to(method):
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            # The stubs type handlers for the sync server; under grpc.aio they are coroutines.
            self.wrap(method, cast(Behavior, handler.unary_unary)),
            request_deserializer=self.deserializer(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def _code_name(code: grpc.StatusCode | None) -> str:
    return "OK" if code is None else code.name


async def _observed(
    behavior: Behavior, request: Any, context: Context, done: Callable[[str, float], None]
) -> Any:
    """Runs the RPC and calls done(status code name, seconds) with what the client got."""
    started = time.perf_counter()
    code = "UNKNOWN"  # what gRPC answers for an unexpected exception
    try:
        response = await behavior(request, context)
        code = _code_name(context.code())
        return response
    except grpc.aio.AbortError:
        code = _code_name(context.code())
        raise
    except asyncio.CancelledError:
        # A status already sent (abort, then a server stop) is what the client got.
        sent = context.code()
        code = "CANCELLED" if sent is None else sent.name
        raise
    finally:
        done(code, time.perf_counter() - started)


class RequestLogInterceptor(_UnaryWrapper):
    """Gives every RPC a request id (in `logs.request_id_var`, so every log line written while
    serving it carries it) and logs one DEBUG line per RPC: method, status code, duration."""

    def __init__(self, logger: logging.Logger = log) -> None:
        super().__init__()
        self._log = logger
        # A per-process prefix keeps ids from different replicas or restarts apart.
        self._prefix = secrets.token_hex(3)
        self._counter = itertools.count(1)

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        def log_line(code: str, seconds: float) -> None:
            millis = seconds * 1000
            self._log.debug(
                "%s %s %.1fms",
                method,
                code,
                millis,
                extra={
                    "request_id": request_id_var.get(),
                    "method": method,
                    "code": code,
                    "duration_ms": round(millis, 3),
                },
            )

        async def logged(request: Any, context: Context) -> Any:
            request_id_var.set(f"{self._prefix}-{next(self._counter)}")
            if not self._log.isEnabledFor(logging.DEBUG):
                return await behavior(request, context)
            return await _observed(behavior, request, context, log_line)

        return logged


class MetricsInterceptor(_UnaryWrapper):
    """Reports every RPC's short method name, status code and duration to `observe`."""

    def __init__(self, observe: Callable[[str, str, float], None]) -> None:
        super().__init__()
        self._observe = observe

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        name = method.rsplit("/", 1)[-1]

        def done(code: str, seconds: float) -> None:
            self._observe(name, code, seconds)

        async def measured(request: Any, context: Context) -> Any:
            return await _observed(behavior, request, context, done)

        return measured


class AllowedClientsInterceptor(_UnaryWrapper):
    """Answers PERMISSION_DENIED unless the client certificate's CN or one of its DNS SANs is
    in `allowed` (compared case-insensitively).

    Only the services in `services` are guarded: health checks and reflection stay open to any
    client that passed the mTLS handshake (the client CA already vouches for it), so monitoring
    can use its own certificate.
    """

    def __init__(self, allowed: Iterable[str], services: Iterable[str]) -> None:
        super().__init__()
        self._allowed = frozenset(name.lower() for name in allowed)
        self._prefixes = tuple(f"/{service}/" for service in services)
        # identity (CN values, DNS SAN values) -> None when allowed, else the denial message
        self._decisions: dict[tuple[tuple[bytes, ...], tuple[bytes, ...]], str | None] = {}

    def applies_to(self, method: str) -> bool:
        return method.startswith(self._prefixes)

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        async def checked(request: Any, context: Context) -> Any:
            denial = self.decide(context.auth_context())
            if denial is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, denial)
            return await behavior(request, context)

        return checked

    def decide(self, auth: Any) -> str | None:
        """None when the peer in this auth context may call, else why not."""
        key = (tuple(auth.get("x509_common_name", ())), tuple(auth.get("peer_dns", ())))
        try:
            return self._decisions[key]
        except KeyError:
            pass
        decision = self._evaluate(*key)
        if len(self._decisions) >= MAX_CACHED_IDENTITIES:
            self._decisions.clear()
        self._decisions[key] = decision
        if decision is not None:
            # The allowed names go to our log only, not to the refused client.
            log.warning("refusing client: %s %s", decision, sorted(self._allowed))
        return decision

    def _evaluate(self, common_names: tuple[bytes, ...], dns: tuple[bytes, ...]) -> str | None:
        cns = [n.decode(errors="replace") for n in common_names]
        sans = [n.decode(errors="replace") for n in dns]
        if any(name.lower() in self._allowed for name in (*cns, *sans)):
            return None
        cns, sans = [clip(n) for n in cns], [clip(n) for n in sans]
        if not cns and not sans:
            return "the client certificate names no CN or DNS SAN; tls.allowedClients needs one"
        who = cns[0] if cns else sans[0]
        return (
            f"client {who!r} (certificate CN {cns or '-'}, DNS SANs {sans or '-'}) "
            "is not in tls.allowedClients"
        )


class _Undecodable:
    """Stands in for request bytes that did not parse, so the handler can refuse them."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf's DecodeError, whatever the parser raises
            return _Undecodable(str(exc) or type(exc).__name__)

    return parse


class MalformedRequestInterceptor(_UnaryWrapper):
    """Answers INVALID_ARGUMENT, naming the parse error, for request bytes that are no valid
    message (corrupt wire format, a string field that is not UTF-8). Left to gRPC, a request
    deserializer's exception becomes UNKNOWN "Unexpected <class DecodeError>", which reads as a
    server crash. Innermost in the chain: the other interceptors pass the stand-in through."""

    def deserializer(self, deserialize: Any) -> Any:
        return None if deserialize is None else _lenient(deserialize)

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        async def checked(request: Any, context: Context) -> Any:
            if isinstance(request, _Undecodable):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"malformed request message for {method}: {request.error}",
                )
            return await behavior(request, context)

        return checked
