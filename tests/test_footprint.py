"""What `serve` loads: the packages it does not need stay out of its memory.

The gRPC server is the compiled transport, so the grpc package (grpcio, ~10 MB resident) is
for clients and other commands only; the kubernetes client loads only with the `kubernetes:`
section, aiohttp (~9 MB) only with `metrics.listen` (app.py). Checked in a fresh interpreter
that imports what `serve` imports before it reads its config (RSS figures:
bench/footprint.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

NOT_LOADED_BY_SERVE = ("grpc", "grpc_tools", "grpc_reflection", "kubernetes", "aiohttp")

PROBE = """
import json, sys
import cloudscale_autoscaler.cli
from cloudscale_autoscaler.commands.serve import serve_command
from cloudscale_autoscaler.app import start_provider
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def test_serve_path_imports_neither_grpc_nor_kubernetes_nor_aiohttp() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True, timeout=60
    )
    loaded = set(json.loads(done.stdout))
    assert "cloudscale_autoscaler" in loaded and "google" in loaded  # the probe did import
    assert loaded.isdisjoint(NOT_LOADED_BY_SERVE), sorted(loaded & set(NOT_LOADED_BY_SERVE))


def test_our_status_codes_are_grpcs() -> None:
    import grpc

    from cloudscale_autoscaler.service.codes import StatusCode

    assert {c.name: c.value for c in StatusCode} == {c.name: c.value[0] for c in grpc.StatusCode}
