"""The real Cluster Autoscaler as a process of the run, calling our server over mTLS."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.procs import Proc, Processes, free_port
from bench.realca.testbed import Kube
from bench.stack import Endpoint, Pki

NAMESPACE = "kube-system"  # where CA keeps its status ConfigMap
GRPC_TIMEOUT = "10s"


@dataclass(frozen=True)
class Autoscaler:
    proc: Proc
    metrics_url: str


def flags(scan_interval_s: int) -> list[str]:
    """What the run sets besides where things are: its defaults otherwise (scale-down
    enabled). --v=0: CA logs a line per node and loop from --v=1 on (with the group at its
    minSize: "Skipping ... node group min size reached"), work that is not the loop's."""
    return [
        f"--scan-interval={scan_interval_s}s",
        "--scale-down-enabled=true",
        "--leader-elect=false",
        "--v=0",
        "--logtostderr",
    ]


def start_autoscaler(
    procs: Processes,
    version: str,
    binary: Path,
    kube: Kube,
    server: Endpoint,
    pki: Pki,
    directory: Path,
    scan_interval_s: int,
) -> Autoscaler:
    directory.mkdir(parents=True, exist_ok=True)
    cloud_config = directory / "cloud-config.yaml"
    cloud_config.write_text(yaml.safe_dump({
        "address": server.address, "cert": str(pki.client_cert), "key": str(pki.client_key),
        "cacert": str(pki.ca), "grpc_timeout": GRPC_TIMEOUT,
    }))  # fmt: skip
    port = free_port()
    proc = procs.start(
        f"cluster-autoscaler-{version}",
        [
            str(binary),
            "--cloud-provider=externalgrpc",
            f"--cloud-config={cloud_config}",
            f"--kubeconfig={kube.admin_kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--address=127.0.0.1:{port}",
            *flags(scan_interval_s),
        ],
    )
    return Autoscaler(proc, f"http://127.0.0.1:{port}/metrics")
