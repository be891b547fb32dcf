"""Conformance: the Go harness in tests/conformance/ drives our real server the way the Cluster
Autoscaler's externalgrpc client does, once per supported CA release, and checks what CA sees.

Everything runs as real processes on loopback: the emulator (`cloudscale-autoscaler emulator`),
our server (`cloudscale-autoscaler serve`, mTLS with certificates from `cloudscale-autoscaler
certs`) and the harness binary built with that release's version module
(tests/conformance/ca-<release>/go.mod). See docs/conformance.md.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.tools import cli, free_port

pytestmark = pytest.mark.conformance

CONFORMANCE = Path(__file__).parent / "conformance"
HARNESS = CONFORMANCE / "harness"
BIN = CONFORMANCE / "bin"
RELEASES = ("1.34.1", "1.34.5", "1.36.1")
GO = shutil.which("go")

# A cold build compiles grpc-go, protobuf-go and k8s.io/api from source on 2 cores.
BUILD_TIMEOUT = 900.0
HARNESS_TIMEOUT = 300.0
START_TIMEOUT = 30.0
TOKEN = "conformance-token"
CLUSTER = "conformance"
IMAGE = "debian-12"

# What CA passes to GetOptions (CA's own defaults, with scaleDownUnreadyTime made distinctive
# so an answer that ignores the request's defaults shows).
DEFAULTS = {
    "scaleDownUtilizationThreshold": 0.5,
    "scaleDownGpuUtilizationThreshold": 0.5,
    "scaleDownUnneededTime": "10m",
    "scaleDownUnreadyTime": "21m",
    "maxNodeProvisionTime": "15m",
    "zeroOrMaxNodeScaling": False,
    "ignoreDaemonSetsUtilization": False,
}
GPU_OVERRIDES = {
    "scaleDownUtilizationThreshold": 0.35,
    "scaleDownUnneededTime": "3m",
    "maxNodeProvisionTime": "25m",
    "ignoreDaemonSetsUtilization": True,
}


@dataclass(frozen=True)
class GroupSpec:
    """A node group as configured, plus what the harness must see for it."""

    name: str
    min_size: int
    max_size: int
    flavor: str
    zone: str
    vcpus: int
    gpus: int
    cpu_reserved_milli: int
    max_pods: int
    labels: dict[str, str]
    taints: list[dict[str, str]]
    options: dict[str, Any] | None

    def config(self) -> dict[str, Any]:
        half = self.cpu_reserved_milli // 2
        group: dict[str, Any] = {
            "name": self.name,
            "minSize": self.min_size,
            "maxSize": self.max_size,
            "flavor": self.flavor,
            "image": IMAGE,
            "zone": self.zone,
            "labels": self.labels,
            "taints": self.taints,
            "kubelet": {
                "maxPods": self.max_pods,
                "systemReserved": {"cpu": f"{half}m", "memory": "512Mi"},
                "kubeReserved": {"cpu": f"{self.cpu_reserved_milli - half}m", "memory": "256Mi"},
                "evictionHard": {"memory.available": "100Mi"},
            },
        }
        if self.options is not None:
            group["autoscalingOptions"] = self.options
        return group

    def expected(self, template: dict[str, Any]) -> dict[str, Any]:
        options = None if self.options is None else {**DEFAULTS, **self.options}
        return {
            "id": self.name,
            "minSize": self.min_size,
            "maxSize": self.max_size,
            "flavor": self.flavor,
            "zone": self.zone,
            "vcpus": self.vcpus,
            "gpus": self.gpus,
            "allocatableCpu": f"{self.vcpus * 1000 - self.cpu_reserved_milli}m",
            "pods": self.max_pods,
            "labels": self.labels,
            "taints": self.taints,
            "options": options,
            "template": template,
        }


GROUPS = (
    GroupSpec(
        name="workers",
        min_size=0,
        max_size=5,
        flavor="flex-8-4",
        zone="lpg1",
        vcpus=4,
        gpus=0,
        cpu_reserved_milli=150,
        max_pods=58,
        labels={"role": "worker"},
        taints=[],
        options=None,
    ),
    GroupSpec(
        name="gpu",
        min_size=0,
        max_size=2,
        flavor="gpu2-128-16-1-200",
        zone="rma1",
        vcpus=16,
        gpus=1,
        cpu_reserved_milli=300,
        max_pods=110,
        labels={"role": "gpu"},
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        options=GPU_OVERRIDES,
    ),
)


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode} before listening")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not listen on 127.0.0.1:{port} within {START_TIMEOUT}s")


class Processes:
    """Background processes of one test, stopped (and their logs kept) at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append((name, proc))
        return proc

    def logs(self) -> str:
        parts = []
        for name, _ in self.procs:
            text = (self.logdir / f"{name}.log").read_text(errors="replace")
            parts.append(f"--- {name} log (tail) ---\n{text[-6000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    procs.stop()


def go_build(release: str) -> Path:
    """Build the harness with the release's version module; Go's caches make rebuilds fast."""
    assert GO is not None
    out = BIN / f"ca-{release}"
    result = subprocess.run(
        [GO, "build", "-modfile", f"../ca-{release}/go.mod", "-o", str(out), "."],
        cwd=HARNESS,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"go build for CA {release} failed:\n{result.stderr}"
    return out


def make_certs(directory: Path) -> Path:
    result = subprocess.run(
        cli("certs", "--out", str(directory)), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"certs --out {directory} failed:\n{result.stderr}"
    return directory


def write_yaml(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def server_config(tmp: Path, pki: Path, emulator_port: int, listen_port: int, **extra: Any) -> Path:
    (tmp / "token").write_text(TOKEN)
    (tmp / "token").chmod(0o600)
    return write_yaml(
        tmp / "config.yaml",
        {
            "cluster": CLUSTER,
            "listen": f"127.0.0.1:{listen_port}",
            "tls": {
                "cert": str(pki / "server.crt"),
                "key": str(pki / "server.key"),
                "clientCA": str(pki / "ca.crt"),
            },
            "cloudscale": {"url": f"http://127.0.0.1:{emulator_port}/v1", "tokenFile": "token"},
            # The scenario expects an immediately rejected create to fail IncreaseSize; a
            # generous wait keeps "immediately" true on a loaded machine (CA allows 5 s).
            "increaseSizeWait": "3s",
            "nodeGroups": [group.config() for group in GROUPS],
            **extra,
        },
    )


def cloud_config(path: Path, port: int, client: Path, ca: Path) -> Path:
    """CA's cloud-config for the externalgrpc provider."""
    return write_yaml(
        path,
        {
            "address": f"127.0.0.1:{port}",
            "cert": str(client / "client.crt"),
            "key": str(client / "client.key"),
            "cacert": str(ca / "ca.crt"),
            "grpc_timeout": "10s",
        },
    )


def rendered_template(config: Path, group: str) -> dict[str, Any]:
    """What our renderer produces for the group: CA must decode exactly this."""
    result = subprocess.run(
        cli("template", "--config", str(config), group, "-o", "json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"template {group} failed:\n{result.stderr}"
    node: dict[str, Any] = json.loads(result.stdout)
    return node


def wait_for_emulator(port: int, proc: subprocess.Popen[bytes]) -> None:
    wait_for_port(port, proc, "emulator")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_emulator/stats", timeout=5) as r:
        assert r.status == 200


@pytest.fixture(scope="module")
def harness_binaries() -> dict[str, Path]:
    """Harness binaries built so far in this module, by release: one go build per release."""
    if GO is None:
        pytest.skip("go is not installed: the conformance harness is a Go program")
    return {}


@dataclass(frozen=True)
class Stack:
    emulator_port: int
    server_port: int
    config: Path
    pki: Path
    other_pki: Path


def start_stack(tmp: Path, processes: Processes, **extra: Any) -> Stack:
    """Emulator and our server as processes on free loopback ports, with fresh certificates;
    `extra` top-level keys go into the server's config."""
    pki, other = make_certs(tmp / "pki"), make_certs(tmp / "other-pki")
    emulator_port, server_port = free_port(), free_port()
    listen = f"127.0.0.1:{emulator_port}"
    emulator = processes.start(
        "emulator", cli("emulator", "--listen", listen, "--token", TOKEN, "--boot-seconds", "0")
    )
    wait_for_emulator(emulator_port, emulator)
    config = server_config(tmp, pki, emulator_port, server_port, **extra)
    server = processes.start("server", cli("serve", "--config", str(config)))
    wait_for_port(server_port, server, "server")
    return Stack(emulator_port, server_port, config, pki, other)


def expectations(tmp: Path, stack: Stack) -> Path:
    """What CA must see, from our configuration (and our renderer, for the templates)."""
    port = stack.server_port
    rejected = [
        (
            "client-trusts-another-CA",
            cloud_config(tmp / "bad1.yaml", port, stack.pki, stack.other_pki),
        ),
        (
            "client-cert-of-another-CA",
            cloud_config(tmp / "bad2.yaml", port, stack.other_pki, stack.pki),
        ),
    ]
    expect = {
        "cluster": CLUSTER,
        "image": IMAGE,
        "gpuLabel": "cloudscale.ch/gpu",
        "scaleGroup": "workers",
        "otherGroup": "gpu",
        "defaults": DEFAULTS,
        "rejectedCloudConfigs": [{"name": name, "path": str(path)} for name, path in rejected],
        "groups": [g.expected(rendered_template(stack.config, g.name)) for g in GROUPS],
    }
    path = tmp / "expect.json"
    path.write_text(json.dumps(expect, indent=2))
    return path


@pytest.mark.timeout(BUILD_TIMEOUT + HARNESS_TIMEOUT + 120)
@pytest.mark.parametrize("release", RELEASES)
def test_ca_client_sees_a_conforming_provider(
    release: str, tmp_path: Path, processes: Processes, harness_binaries: dict[str, Path]
) -> None:
    if release not in harness_binaries:
        harness_binaries[release] = go_build(release)
    stack = start_stack(tmp_path, processes)
    expect = expectations(tmp_path, stack)
    run_harness(release, harness_binaries[release], tmp_path, stack, expect, processes)


def run_harness(
    release: str,
    binary: Path,
    tmp: Path,
    stack: Stack,
    expect: Path,
    processes: Processes,
    *args: str,
) -> str:
    """Run the harness against the stack with CA's cloud-config; it must pass every check."""
    good = cloud_config(tmp / "cloud-config.yaml", stack.server_port, stack.pki, stack.pki)
    result = subprocess.run(
        [
            str(binary),
            *("-cloud-config", str(good), "-expect", str(expect), *args),
            *("-emulator", f"http://127.0.0.1:{stack.emulator_port}"),
        ],
        capture_output=True,
        text=True,
        timeout=HARNESS_TIMEOUT,
        check=False,
    )
    output = result.stdout + result.stderr
    print(output)  # shown with `pytest -rP` (or -s): one line per check
    assert result.returncode == 0, (
        f"CA {release} harness failed (exit {result.returncode}):\n{output}\n{processes.logs()}"
    )
    assert f"[CA {release}]" in output and " 0 failed" in output, output
    return output
