"""What bounds the gRPC server under any client, in the spirit of grpc-go's and Envoy's defaults.

The Cluster Autoscaler makes one call at a time on one connection, with small headers, and its
largest request (NodeGroupDeleteNodes) is at most MAX_RECEIVE_BYTES (16 MiB). An authenticated
client may do anything else; these keep the process inside the chart's 384 MiB memory limit
and the server answering CA within its 5 s deadline meanwhile. The transport applies them; the
values are decided here.

- MAX_CONCURRENT_STREAMS: calls at once per connection (HTTP/2 SETTINGS); a stream beyond it
  is refused (RST_STREAM REFUSED_STREAM), and a client that keeps opening them has its
  connection closed (h2's limit of 1024 streams reset for errors: GOAWAY ENHANCE_YOUR_CALM).
- MAX_HEADER_LIST_BYTES: a call whose headers decode to more is answered HTTP 431 and its stream
  reset (REFUSED_STREAM); the connection's other calls go on. Only beyond 4 times that, or a
  header block in more than 5 CONTINUATION frames, does h2 end the whole connection (GOAWAY
  ENHANCE_YOUR_CALM): those are its fixed abuse limits, which the library does not let us raise.
- RECEIVE_BUDGET_BYTES: request message bytes being received or handled at once, over all
  connections. A message takes its share when its 5-byte length prefix arrives and keeps it
  until its call is answered (Python's copy and decoding included); one that does not fit
  is refused at once with RESOURCE_EXHAUSTED, never queued or buffered.
- BODY_TIMEOUT_SECONDS: a call whose request message has not arrived whole this long after its
  headers ends DEADLINE_EXCEEDED, whatever the caller's own deadline (or none).
- IDLE_TIMEOUT_SECONDS: a connection without a call for this long is sent GOAWAY and closed,
  including those of clients allowedClients refuses. CA calls every scan interval (10 s by
  default); with a longer one it simply reconnects.
- KEEPALIVE_INTERVAL_SECONDS / KEEPALIVE_TIMEOUT_SECONDS: after this long without a frame from
  the client the server sends an HTTP/2 PING; no answer within the timeout closes the
  connection, so a vanished peer does not hold one.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudscale_autoscaler import _transport

MAX_RECEIVE_BYTES: int = _transport.MAX_RECEIVE_BYTES
MAX_CONCURRENT_STREAMS = 100
MAX_HEADER_LIST_BYTES = 32 * 1024
# Two of the largest messages at once: CA sends one at a time.
RECEIVE_BUDGET_BYTES = 2 * MAX_RECEIVE_BYTES
BODY_TIMEOUT_SECONDS = 30.0
IDLE_TIMEOUT_SECONDS = 30.0
KEEPALIVE_INTERVAL_SECONDS = 60.0
KEEPALIVE_TIMEOUT_SECONDS = 20.0


@dataclass(frozen=True)
class Limits:
    """The values the transport is started with (attribute names are its contract)."""

    max_concurrent_streams: int = MAX_CONCURRENT_STREAMS
    max_header_list_bytes: int = MAX_HEADER_LIST_BYTES
    receive_budget_bytes: int = RECEIVE_BUDGET_BYTES
    body_timeout: float = BODY_TIMEOUT_SECONDS
    idle_timeout: float = IDLE_TIMEOUT_SECONDS
    keepalive_interval: float = KEEPALIVE_INTERVAL_SECONDS
    keepalive_timeout: float = KEEPALIVE_TIMEOUT_SECONDS


DEFAULT_LIMITS = Limits()
