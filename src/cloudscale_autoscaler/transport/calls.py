"""Calls the compiled transport forwards to Python: every RPC it has no prepared answer for.

The transport hands each one over on the event loop (`Calls.dispatch`) with the request bytes,
the caller's timeout and the request id it assigned. Here the bytes are parsed (bytes that are
no valid message get INVALID_ARGUMENT naming the parse error), the servicer's method runs with
a `CallContext`, and the answer goes back through `reply`: serialized bytes, or a status code
and message. `after_call` runs before the answer leaves, so the hot answers the next call may
be served from already reflect what this call changed (CA calls strictly one at a time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from google.protobuf.message import Message

from cloudscale_autoscaler.observability.logs import request_id_var
from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.service.codes import StatusCode

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["CloudProvider"]
CODE_NAMES: dict[int, str] = {code.value: code.name for code in StatusCode}


class Reply(Protocol):
    """The transport's answer channel for one call; exactly one method is called."""

    def ok(self, message: bytes) -> None: ...

    def error(self, code: int, message: str) -> None: ...


class RpcError(Exception):
    """Ends a call with a status other than OK (raised by `CallContext.abort`)."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """What a servicer method gets besides the request: the deadline and a way to fail."""

    __slots__ = ("_deadline",)

    def __init__(self, deadline: float | None) -> None:
        self._deadline = deadline  # event loop time, None without a caller's timeout

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def abort(self, code: StatusCode, details: str) -> NoReturn:
        raise RpcError(code, details)


@dataclass(frozen=True)
class Method:
    name: str
    path: str
    request_type: type[Message]
    # The servicer's coroutine; None when the servicer does not implement the RPC.
    handler: Callable[[Any, CallContext], Any] | None


def methods(servicer: object) -> list[Method]:
    """The CloudProvider RPCs in proto order, each with the servicer's method if it has one.
    A servicer is any object with a coroutine method per RPC it implements, named as in the
    proto (not grpc's generated base class: serving needs no grpc package)."""
    table = []
    for rpc in SERVICE.methods:
        implemented = getattr(type(servicer), rpc.name, None) is not None
        table.append(
            Method(
                rpc.name,
                f"/{SERVICE.full_name}/{rpc.name}",
                getattr(pb, rpc.input_type.name),
                getattr(servicer, rpc.name) if implemented else None,
            )
        )
    return table


class Calls:
    def __init__(self, servicer: object) -> None:
        self.methods = methods(servicer)
        # Publishes the hot answers after every forwarded call (see the module docstring).
        self.after_call: Callable[[], None] = lambda: None
        self._tasks: dict[str, asyncio.Task[None]] = {}  # request id -> call in progress

    def dispatch(
        self, index: int, data: bytes, timeout: float | None, request_id: str, reply: Reply
    ) -> None:
        """Called by the transport on the event loop."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        task = loop.create_task(self._serve(self.methods[index], data, deadline, request_id, reply))
        self._tasks[request_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request_id, None))

    def cancel(self, request_id: str) -> None:
        """Called by the transport on the event loop when the caller is gone (its deadline
        passed, it cancelled, the server cut the call off at the end of the drain)."""
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    def cancel_all(self) -> None:
        """After the transport stopped: calls still running have nobody to answer to."""
        for task in self._tasks.values():
            task.cancel()

    async def _serve(
        self, method: Method, data: bytes, deadline: float | None, request_id: str, reply: Reply
    ) -> None:
        request_id_var.set(request_id)
        try:
            response = await self._answer(method, data, deadline)
        except RpcError as error:
            self._after_call()
            reply.error(error.code.value, error.details)
        except asyncio.CancelledError:
            self._after_call()
            reply.error(StatusCode.CANCELLED.value, "the server stopped")
            raise
        except Exception as error:
            log.exception("%s failed", method.path)
            self._after_call()
            reply.error(StatusCode.UNKNOWN.value, f"Unexpected {type(error)!r}: {error}")
        else:
            self._after_call()
            reply.ok(response.SerializeToString())

    async def _answer(self, method: Method, data: bytes, deadline: float | None) -> Any:
        if method.handler is None:
            raise RpcError(
                StatusCode.UNIMPLEMENTED,
                f"{method.name} is not implemented by cloudscale-autoscaler",
            )
        try:
            request = method.request_type.FromString(data)
        except Exception as exc:  # protobuf's DecodeError, whatever the parser raises
            raise RpcError(
                StatusCode.INVALID_ARGUMENT,
                f"malformed request message for {method.path}: {str(exc) or type(exc).__name__}",
            ) from None
        return await method.handler(request, CallContext(deadline))

    def _after_call(self) -> None:
        try:
            self.after_call()
        except Exception:
            log.exception("publishing the hot answers failed")

    def log_rpc(self, request_id: str, index: int, code: int, seconds: float) -> None:
        """The transport's debug line per RPC (it calls this only while DEBUG is on)."""
        path = self.methods[index].path
        name = CODE_NAMES.get(code, str(code))
        millis = seconds * 1000
        log.debug(
            "%s %s %.1fms",
            path,
            name,
            millis,
            extra={
                "request_id": request_id,
                "method": path,
                "code": name,
                "duration_ms": round(millis, 3),
            },
        )
