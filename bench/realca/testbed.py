"""What the real-CA workload reuses from the tests' fixtures (tests/fixtures/): the loopback
kube-apiserver with etcd (kube.py) and the Cluster Autoscaler binary of each generation
(autoscaler.py), both built into ~/.cache/cloudscale-autoscaler/bin by CI or on first use."""

from __future__ import annotations

import pytest

from bench import fixtures_path

fixtures_path.add()

from fixtures.autoscaler import GENERATIONS, ensure_autoscaler  # noqa: E402
from fixtures.kube import Kube, ensure_apiserver, ensure_etcd, running_kube  # noqa: E402
from fixtures.tools import ToolUnavailable  # noqa: E402

# What running_kube raises (pytest.fail) when etcd or kube-apiserver does not come up.
StartFailed = pytest.fail.Exception

__all__ = [
    "GENERATIONS",
    "Kube",
    "StartFailed",
    "ToolUnavailable",
    "ensure_apiserver",
    "ensure_autoscaler",
    "ensure_etcd",
    "running_kube",
]
