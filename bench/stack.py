"""The system under test: certificates, the emulator and its population, our server and the
Go reference server, each a separate process on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.procs import Proc, Processes, cli, free_port

CLUSTER = "bench"
OTHER_CLUSTER = "other"
TOKEN = "bench-token"
FLAVOR = "flex-4-2"
IMAGE = "debian-12"
ZONE = "lpg1"
CLIENT_NAME = "cluster-autoscaler"  # the CN `cloudscale-autoscaler certs` gives the client
# Every group has explicit autoscalingOptions, so GetOptions answers (instead of Unimplemented)
# in both servers. Durations in Go syntax for our config, in seconds for goref.
OPTIONS = {
    "scaleDownUtilizationThreshold": 0.6,
    "scaleDownUnneededTime": "5m",
    "maxNodeProvisionTime": "20m",
}
OPTIONS_GOREF = {
    "scaleDownUtilizationThreshold": 0.6,
    "scaleDownUnneededTime": 300,
    "maxNodeProvisionTime": 1200,
}
HTTP_TIMEOUT = 120.0
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certs(directory: Path) -> Pki:
    """Development mTLS certificates from `cloudscale-autoscaler certs`."""
    subprocess.run(cli("certs", "--out", str(directory)), check=True, capture_output=True)
    return Pki(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )


class EmulatorAdmin:
    """The emulator's /_emulator/ admin API (loopback only)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.api_url = f"{self.base}/v1"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.base}/_emulator/{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def reset(self) -> None:
        self._call("POST", "reset")

    def populate(self, count: int, tags: dict[str, str], name_prefix: str) -> list[str]:
        if count <= 0:
            return []
        body = {
            "count": count,
            "tags": tags,
            "flavor": FLAVOR,
            "image": IMAGE,
            "zone": ZONE,
            "status": "running",
            "name_prefix": name_prefix,
        }
        uuids: list[str] = self._call("POST", "populate", body)["uuids"]
        return uuids

    def set_faults(self, faults: dict[str, Any]) -> None:
        self._call("PUT", "faults", faults)

    def clear_faults(self) -> None:
        self._call("DELETE", "faults")

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._call("GET", "stats")
        return stats


@dataclass(frozen=True)
class Layout:
    """What the emulator holds: `size` servers of ours spread over `groups` groups, servers
    of another cluster (in the cloud, not in Kubernetes), and untagged servers (static nodes
    of our cluster, e.g. the control plane: in Kubernetes, not managed by us)."""

    size: int
    groups: int

    @property
    def group_names(self) -> list[str]:
        return [f"g{i}" for i in range(self.groups)]

    def per_group(self, index: int) -> int:
        base, extra = divmod(self.size, self.groups)
        return base + (1 if index < extra else 0)

    @property
    def foreign(self) -> int:
        return self.size // 2

    @property
    def untagged(self) -> int:
        return max(10, self.size // 10)


@dataclass
class Population:
    layout: Layout
    own: dict[str, list[str]]  # group -> server uuids
    untagged: list[str]

    def nodes(self) -> list[dict[str, str]]:
        """The Kubernetes nodes CA sees: ours, then the static (unmanaged) ones."""
        refs = []
        for uuids in self.own.values():
            refs += [{"providerID": f"cloudscale://{u}", "name": f"node-{u[:8]}"} for u in uuids]
        refs += [
            {"providerID": f"cloudscale://{u}", "name": f"static-{u[:8]}"} for u in self.untagged
        ]
        return refs


def populate(admin: EmulatorAdmin, layout: Layout) -> Population:
    admin.reset()
    own = {}
    for index, name in enumerate(layout.group_names):
        tags = {"k8s-cluster": CLUSTER, "k8s-autoscaler-group": name}
        own[name] = admin.populate(layout.per_group(index), tags, f"{CLUSTER}-{name}")
    admin.populate(
        layout.foreign, {"k8s-cluster": OTHER_CLUSTER, "k8s-autoscaler-group": "g0"}, OTHER_CLUSTER
    )
    untagged = admin.populate(layout.untagged, {}, "static")
    return Population(layout, own, untagged)


@dataclass(frozen=True)
class ServerSettings:
    max_concurrent_creates: int = 10
    requests_per_second: float | None = None
    # Serve /metrics on a port of its own (Endpoint.metrics_url).
    metrics: bool = False
    # minSize = each group's population instead of 0: CA has nothing to scale down.
    keep_population: bool = False


def max_size(layout: Layout, index: int) -> int:
    # Room above the population for IncreaseSize.
    return layout.per_group(index) + 1000


def write_server_config(
    directory: Path,
    pki: Pki,
    emulator: EmulatorAdmin,
    port: int,
    layout: Layout,
    settings: ServerSettings,
    metrics_port: int | None = None,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    token = directory / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    cloudscale: dict[str, Any] = {
        "url": emulator.api_url,
        "tokenFile": str(token),
        "maxConcurrentCreates": settings.max_concurrent_creates,
    }
    if settings.requests_per_second is not None:
        cloudscale["requestsPerSecond"] = settings.requests_per_second
    config = {
        "cluster": CLUSTER,
        "listen": f"127.0.0.1:{port}",
        "tls": {
            "cert": str(pki.server_cert),
            "key": str(pki.server_key),
            "clientCA": str(pki.ca),
            "allowedClients": [CLIENT_NAME],
        },
        "cloudscale": cloudscale,
        "nodeGroups": [
            {
                "name": name,
                "minSize": layout.per_group(i) if settings.keep_population else 0,
                "maxSize": max_size(layout, i),
                "flavor": FLAVOR,
                "image": IMAGE,
                "zone": ZONE,
                "autoscalingOptions": OPTIONS,
            }
            for i, name in enumerate(layout.group_names)
        ],
    }
    if metrics_port is not None:
        config["metrics"] = {"listen": f"127.0.0.1:{metrics_port}"}
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_goref_state(directory: Path, population: Population) -> Path:
    layout = population.layout
    state = {
        "groups": [
            {
                "id": name,
                "minSize": 0,
                "maxSize": max_size(layout, i),
                "targetSize": len(population.own[name]),
                "options": OPTIONS_GOREF,
            }
            for i, name in enumerate(layout.group_names)
        ],
        "nodes": {
            f"cloudscale://{u}": name for name, uuids in population.own.items() for u in uuids
        },
    }
    path = directory / "goref-state.json"
    path.write_text(json.dumps(state))
    return path


@dataclass
class Endpoint:
    """A running server under test: its process and gRPC address."""

    proc: Proc
    address: str
    metrics_url: str | None = None  # our server's /metrics, when ServerSettings.metrics


def start_emulator(procs: Processes) -> tuple[Proc, EmulatorAdmin]:
    port = free_port()
    proc = procs.start(
        "emulator",
        cli(
            "--log-level",
            "warning",
            "emulator",
            "--listen",
            f"127.0.0.1:{port}",
            "--token",
            TOKEN,
            "--boot-seconds",
            "0",
        ),
    )
    proc.wait_for_port(port)
    return proc, EmulatorAdmin(port)


def start_server(
    procs: Processes,
    config_dir: Path,
    pki: Pki,
    emulator: EmulatorAdmin,
    layout: Layout,
    settings: ServerSettings,
) -> Endpoint:
    port = free_port()
    metrics_port = free_port() if settings.metrics else None
    config = write_server_config(config_dir, pki, emulator, port, layout, settings, metrics_port)
    proc = procs.start("server", cli("--log-level", "warning", "serve", "--config", str(config)))
    proc.wait_for_port(port)
    if metrics_port is None:
        return Endpoint(proc, f"127.0.0.1:{port}")
    proc.wait_for_port(metrics_port)
    return Endpoint(proc, f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics")


def start_goref(procs: Processes, binary: Path, state: Path, pki: Pki) -> Endpoint:
    port = free_port()
    proc = procs.start(
        "goref",
        [
            str(binary),
            "-listen",
            f"127.0.0.1:{port}",
            "-state",
            str(state),
            "-cert",
            str(pki.server_cert),
            "-key",
            str(pki.server_key),
            "-ca",
            str(pki.ca),
            "-allowed-clients",
            CLIENT_NAME,
        ],
    )
    proc.wait_for_port(port)
    return Endpoint(proc, f"127.0.0.1:{port}")


def start_pyref(procs: Processes, state: Path, pki: Pki) -> Endpoint:
    """The bare grpc.aio server (bench/pyref.py): the Python floor."""
    port = free_port()
    proc = procs.start(
        "pyref",
        [
            sys.executable,
            "-m",
            "bench.pyref",
            "--listen",
            f"127.0.0.1:{port}",
            "--state",
            str(state),
            "--cert",
            str(pki.server_cert),
            "--key",
            str(pki.server_key),
            "--ca",
            str(pki.ca),
        ],
        cwd=ROOT,
    )
    proc.wait_for_port(port)
    return Endpoint(proc, f"127.0.0.1:{port}")
