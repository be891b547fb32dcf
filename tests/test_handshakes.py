"""The rate limit on refused-handshake log lines (transport/handshakes.py): a table test."""

from __future__ import annotations

import logging

import pytest

from cloudscale_autoscaler.transport.handshakes import RefusedHandshakes

# (seconds since start, peer) -> logged?, and the count a logged line carries
CASES = [
    (0.0, "10.0.0.1:5000", True, None),
    (1.0, "10.0.0.1:5001", False, None),  # same host, new port: counted
    (2.0, "[fd00::1]:5000", True, None),  # another host
    (30.0, "10.0.0.1:5002", False, None),
    (61.0, "10.0.0.1:5003", True, 2),  # a window later: logged, with what it stood for
    (61.5, "[fd00::1]:5001", False, None),
]


def test_one_line_per_host_per_window(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refused = RefusedHandshakes(window=60.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="cloudscale_autoscaler.transport.handshakes")
    for at, peer, logged, count in CASES:
        now[0] = at
        caplog.clear()
        refused.refused(peer, "peer sent no certificates")
        lines = [r for r in caplog.records if r.getMessage() == "TLS handshake refused"]
        assert len(lines) == int(logged), (at, peer)
        if logged:
            fields = vars(lines[0])
            assert fields["peer"] == peer
            assert fields["reason"] == "peer sent no certificates"
            assert fields.get("refused_since_last_line") == count
