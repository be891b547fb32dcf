"""What the node-memory workload reuses from the tests' fixtures (tests/fixtures/): the cluster
with one real Node and kwok (node.py, cluster.py), the project's image (image.py), the emulator
on the Pod network's gateway and a chart install as a user does it (deployed.py), the Cluster
Autoscaler binary (autoscaler.py)."""

from __future__ import annotations

import pytest

from bench import fixtures_path

fixtures_path.add()

from fixtures.autoscaler import Autoscaler, run_autoscaler  # noqa: E402
from fixtures.cluster import KWOK_ANNOTATION, running_kwok  # noqa: E402
from fixtures.deployed import (  # noqa: E402
    GatewayEmulator,
    all_ready,
    helm_install,
    lease_holder,
    live_pods,
    running_emulator,
    wait_for,
    write_secret_files,
)
from fixtures.image import ensure_image  # noqa: E402
from fixtures.node import RealNode, running_node  # noqa: E402
from fixtures.tools import ToolUnavailable  # noqa: E402

# What the fixtures raise when a start fails (pytest.fail) or the host lacks a prerequisite
# of the real node (pytest.skip).
StartFailed = pytest.fail.Exception
Unavailable = pytest.skip.Exception
# What wait_for raises when its condition is not met in time.
NotReached = AssertionError

__all__ = [
    "KWOK_ANNOTATION",
    "Autoscaler",
    "GatewayEmulator",
    "NotReached",
    "RealNode",
    "StartFailed",
    "ToolUnavailable",
    "Unavailable",
    "all_ready",
    "ensure_image",
    "helm_install",
    "lease_holder",
    "live_pods",
    "run_autoscaler",
    "running_emulator",
    "running_kwok",
    "running_node",
    "wait_for",
    "write_secret_files",
]
