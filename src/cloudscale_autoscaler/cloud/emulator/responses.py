"""JSON responses and errors in Django REST Framework's shape, plus the connection drop."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from cloudscale_autoscaler.cloud.emulator.catalogue import encode
from cloudscale_autoscaler.cloud.emulator.faults import FaultsError
from cloudscale_autoscaler.cloud.emulator.validation import FieldErrors

NOT_FOUND = "Not found."

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """Raised by handlers; becomes a JSON response with this status, body and headers."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = dict(headers or {})
        super().__init__(f"{status}: {body}")


def detail(status: int, message: str, headers: Mapping[str, str] | None = None) -> ApiError:
    return ApiError(status, {"detail": message}, headers)


def json_bytes(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


def json_value(value: Any, status: int = 200) -> web.Response:
    return json_bytes(encode(value), status)


def no_content() -> web.Response:
    return web.Response(status=204)


async def read_json(request: web.Request) -> Any:
    """The body as JSON, whatever the Content-Type; anything else is DRF's 400 ParseError."""
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise detail(400, f"JSON parse error - {exc}") from exc


def error_response(exc: Exception) -> web.Response:
    """Map the exceptions handlers raise (and aiohttp's own) to DRF-shaped JSON."""
    if isinstance(exc, ApiError):
        response = json_value(exc.body, exc.status)
        response.headers.update(exc.headers)
        return response
    if isinstance(exc, FieldErrors):
        return json_value(exc.errors, 400)
    if isinstance(exc, FaultsError):
        return json_value({exc.path: [exc.message]}, 400)
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return json_value({"detail": f'Method "{exc.method}" not allowed.'}, 405)
    if isinstance(exc, web.HTTPNotFound):
        return json_value({"detail": NOT_FOUND}, 404)
    if isinstance(exc, web.HTTPException):
        return json_value({"detail": exc.reason}, exc.status)
    raise exc


async def converted(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (ApiError, FieldErrors, FaultsError, web.HTTPException) as exc:
        return error_response(exc)


class Dropped(web.Response):
    """The placeholder for a response that never reached the client; `outcome` ("dropped" or
    "reset") stands in for the status in the statistics."""

    def __init__(self, outcome: str) -> None:
        super().__init__(status=499)
        self.outcome = outcome


def drop_connection(request: web.Request, *, reset: bool) -> Dropped:
    """End the connection with no response: a FIN (httpx: RemoteProtocolError "Server
    disconnected without sending a response") or, with reset, an RST (httpx: ReadError).

    aiohttp then fails to write the returned placeholder and drops it quietly as a client
    disconnect, so nothing reaches the client and nothing is logged as an error.
    """
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if reset and sock is not None:
            # Linger 0: close() sends RST instead of FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return Dropped("reset" if reset else "dropped")
