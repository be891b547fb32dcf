"""The gRPC wire rules and the per-connection limits of the real transport, seen by a raw
HTTP/2 client over mTLS: only POST with a gRPC content-type is a call (else HTTP 405 / 415,
as the gRPC-over-HTTP/2 spec names), a compressed message without a grpc-encoding is INTERNAL
(as grpc-go answers), a too large header ends its stream and not the connection, and the
limits of transport/limits.py (some shortened here so they show in a test's time)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
from fixtures.tls import PKI, client_ssl_context, make_config, serving

from cloudscale_autoscaler.transport.limits import (
    MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_BYTES,
    Limits,
)

SERVICE = "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
TIMEOUT = 10.0
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
INTERNAL, UNIMPLEMENTED, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED = "13", "12", "8", "4"
PING, GOAWAY, ACK = 0x6, 0x7, 0x1


@dataclass
class Ended:
    """How a stream ended: its response headers and trailers, or its reset."""

    fields: dict[str, str] = field(default_factory=dict)
    reset: int | None = None
    complete: bool = False  # the server ended or reset the stream


class Raw:
    """One HTTP/2 connection, driven by hand (in a worker thread: the server shares the loop)."""

    def __init__(self, tls: socket.socket) -> None:
        self.tls = tls
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.ended: dict[int, Ended] = {}
        self.server_settings: dict[int, int] = {}
        self.pings = 0
        self.goaway: int | None = None  # its error code
        self.closed = False
        self._unparsed = b""  # the server's frames, read as they come (see _scan)
        self.flush()

    def flush(self) -> None:
        self.tls.sendall(self.h2.data_to_send())

    def call(
        self,
        path: str,
        *,
        method: str = "POST",
        content_type: str | None = "application/grpc",
        extra: Sequence[tuple[str, str]] = (),
        body: bytes | None = EMPTY_MESSAGE,
    ) -> int:
        """Starts a call; `body` None sends its headers only. Returns the stream id."""
        stream = self.h2.get_next_available_stream_id()
        headers = [(":method", method), (":scheme", "https"), (":authority", "localhost")]
        headers.append((":path", path))
        if content_type is not None:
            headers.append(("content-type", content_type))
        headers += [("te", "trailers"), *extra]
        self.h2.send_headers(stream, headers, end_stream=body == b"")
        if body:
            self.h2.send_data(stream, body, end_stream=True)
        self.flush()
        return stream

    def read(self, *, answer_pings: bool = True) -> None:
        """Handles what the server sent next; sets `closed` at the end of the connection."""
        try:
            data = self.tls.recv(65536)
        except TimeoutError:
            raise AssertionError(f"nothing from the server for {TIMEOUT} s") from None
        except OSError:  # reset: closed too
            data = b""
        if not data:
            self.closed = True
            return
        pings = self._scan(data)
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            # After GOAWAY the library refuses any further frame, the PING of a graceful
            # GOAWAY among them: _scan saw them, and the PING is answered here.
            assert self.goaway is not None
            for payload in pings if answer_pings else []:
                self.tls.sendall(struct.pack(">I", 8)[1:] + bytes((PING, ACK)) + bytes(4) + payload)
            return
        for event in events:
            self._handle(event)
        if answer_pings:
            self.flush()

    def _scan(self, data: bytes) -> list[bytes]:
        """Notes the server's GOAWAY (its error code) and PINGs from the frames themselves;
        the PINGs' payloads."""
        pings = []
        self._unparsed += data
        while len(self._unparsed) >= 9:
            length = int.from_bytes(self._unparsed[:3])
            if len(self._unparsed) < 9 + length:
                break
            kind, flags = self._unparsed[3], self._unparsed[4]
            payload = self._unparsed[9 : 9 + length]
            self._unparsed = self._unparsed[9 + length :]
            if kind == GOAWAY:
                self.goaway = int.from_bytes(payload[4:8])
            elif kind == PING and not flags & ACK:
                self.pings += 1
                pings.append(payload)
        return pings

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            ended = self.ended.setdefault(event.stream_id, Ended())
            ended.fields.update((bytes(k).decode(), bytes(v).decode()) for k, v in event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self.ended.setdefault(event.stream_id, Ended()).complete = True
        elif isinstance(event, h2.events.StreamReset):
            ended = self.ended.setdefault(event.stream_id, Ended())
            ended.reset, ended.complete = event.error_code, True
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.server_settings.update({k: v.new_value for k, v in event.changed_settings.items()})

    def until_ended(self, stream: int) -> Ended:
        while not (stream in self.ended and self.ended[stream].complete):
            assert not self.closed, f"connection closed before stream {stream} ended"
            self.read()
        return self.ended[stream]


@contextmanager
def raw_connection(port: int, pki: PKI) -> Iterator[Raw]:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as tcp,
        client_ssl_context(pki).wrap_socket(tcp, server_hostname="localhost") as tls,
    ):
        yield Raw(tls)


def one_call(port: int, pki: PKI, **call: object) -> Ended:
    with raw_connection(port, pki) as raw:
        return raw.until_ended(raw.call(f"{SERVICE}/NodeGroups", **call))  # type: ignore[arg-type]


async def call_in_thread(pki: PKI, limits: Limits | None = None, **call: object) -> Ended:
    async with serving(make_config(pki), limits=limits or Limits()) as running:
        return await asyncio.to_thread(one_call, running.port, pki, **call)


@pytest.mark.parametrize("method", ["GET", "PUT"])
async def test_only_post_is_a_call(pki: PKI, method: str) -> None:
    ended = await call_in_thread(pki, method=method)
    assert ended.fields[":status"] == "405"
    assert ended.fields["allow"] == "POST"
    assert ended.fields["grpc-status"] == INTERNAL
    assert ended.fields["grpc-message"] == f"method {method} is not allowed: gRPC calls are POST"


@pytest.mark.parametrize(
    ("content_type", "named"),
    [
        ("text/plain", '"text/plain"'),
        (None, "none"),
        ("application/grpc+json", '"application/grpc+json"'),
    ],
)
async def test_a_content_type_other_than_grpc_is_415(
    pki: PKI, content_type: str | None, named: str
) -> None:
    ended = await call_in_thread(pki, content_type=content_type)
    assert ended.fields[":status"] == "415"
    assert ended.fields["grpc-status"] == INTERNAL
    expected = "expected application/grpc or application/grpc+proto"
    assert ended.fields["grpc-message"] == f"content-type {named} is not served: {expected}"


@pytest.mark.parametrize(
    "content_type", ["application/grpc", "application/grpc+proto", "application/grpc; charset=x"]
)
async def test_grpc_content_types_are_served(pki: PKI, content_type: str) -> None:
    ended = await call_in_thread(pki, content_type=content_type)
    assert (ended.fields[":status"], ended.fields["grpc-status"]) == ("200", "0")


async def test_a_compressed_message_without_grpc_encoding_is_internal(pki: PKI) -> None:
    ended = await call_in_thread(pki, body=b"\x01\x00\x00\x00\x00")
    assert ended.fields["grpc-status"] == INTERNAL
    expected = "compressed flag set in a request message without a grpc-encoding"
    assert ended.fields["grpc-message"] == expected
    # With an encoding it is one this server does not take: UNIMPLEMENTED, as grpc-go says.
    encoding = [("grpc-encoding", "gzip")]
    gzip = await call_in_thread(pki, body=b"\x01\x00\x00\x00\x00", extra=encoding)
    assert gzip.fields["grpc-status"] == UNIMPLEMENTED


def _large_header_then_a_call(port: int, pki: PKI) -> tuple[Ended, Ended, int | None]:
    with raw_connection(port, pki) as raw:
        big = raw.until_ended(raw.call(f"{SERVICE}/NodeGroups", extra=[("x-big", "a" * 65536)]))
        after = raw.until_ended(raw.call(f"{SERVICE}/NodeGroups"))
        return big, after, raw.goaway


async def test_a_too_large_header_ends_its_stream_not_the_connection(pki: PKI) -> None:
    async with serving(make_config(pki)) as running:
        big, after, goaway = await asyncio.to_thread(_large_header_then_a_call, running.port, pki)
    assert big.fields[":status"] == "431", big
    assert after.fields["grpc-status"] == "0"
    assert goaway is None


def _settings(port: int, pki: PKI) -> dict[int, int]:
    with raw_connection(port, pki) as raw:
        while not raw.server_settings:
            raw.read()
        return raw.server_settings


async def test_the_connection_limits_are_announced(pki: PKI) -> None:
    async with serving(make_config(pki)) as running:
        settings = await asyncio.to_thread(_settings, running.port, pki)
    assert settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == MAX_CONCURRENT_STREAMS
    assert settings[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] == MAX_HEADER_LIST_BYTES


async def test_a_body_that_never_completes_is_timed_out(pki: PKI) -> None:
    # No grpc-timeout: only the body timeout ends it.
    ended = await call_in_thread(pki, Limits(body_timeout=0.5), body=None)
    assert ended.fields["grpc-status"] == DEADLINE_EXCEEDED
    assert ended.fields["grpc-message"] == "the request message did not arrive whole within 500ms"


async def test_a_message_beyond_the_receive_budget_is_refused(pki: PKI) -> None:
    budget = Limits(receive_budget_bytes=1000)
    prefix = b"\x00" + struct.pack(">I", 2000)
    ended = await call_in_thread(pki, budget, body=prefix + b"\x00" * 2000)
    assert ended.fields["grpc-status"] == RESOURCE_EXHAUSTED
    assert ended.fields["grpc-message"].startswith(
        "request message of 2000 bytes refused: requests being received or handled hold 0 of "
        "the server's 1000 bytes"
    ), ended
    assert (await call_in_thread(pki, budget)).fields["grpc-status"] == "0"


def _until_closed(port: int, pki: PKI, *, answer_pings: bool) -> Raw:
    with raw_connection(port, pki) as raw:
        while not raw.closed:
            raw.read(answer_pings=answer_pings)
        return raw


async def test_an_idle_connection_is_sent_goaway(pki: PKI) -> None:
    async with serving(make_config(pki), limits=Limits(idle_timeout=0.5)) as running:
        raw = await asyncio.to_thread(_until_closed, running.port, pki, answer_pings=True)
    assert raw.goaway == 0  # NO_ERROR: a graceful close


async def test_a_peer_that_does_not_answer_pings_is_dropped(pki: PKI) -> None:
    limits = Limits(keepalive_interval=0.3, keepalive_timeout=0.3)
    async with serving(make_config(pki), limits=limits) as running:
        raw = await asyncio.to_thread(_until_closed, running.port, pki, answer_pings=False)
    assert raw.pings >= 1
