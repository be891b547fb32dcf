"""Acceptance: `grpcurl` lists our service via reflection and calls it with the dev client cert.

Everything runs as an operator would run it, as separate processes: `cloudscale-autoscaler
certs`, `cloudscale-autoscaler emulator` and `cloudscale-autoscaler serve` on free loopback
ports, then grpcurl (from PATH or built from the Go module proxy, see fixtures/tools.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from fixtures.tools import INSTALL_TIMEOUT_SECONDS, cli, ensure_grpcurl, free_port, run_cli
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloudscale_autoscaler.cloud.models import TAG_CLUSTER, TAG_GROUP

# The first test may have to build grpcurl first.
pytestmark = pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 120)

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
HEALTH = "grpc.health.v1.Health"
RPCS = {
    "NodeGroups", "NodeGroupForNode", "PricingNodePrice", "PricingPodPrice", "GPULabel",
    "GetAvailableGPUTypes", "Cleanup", "Refresh", "NodeGroupTargetSize",
    "NodeGroupIncreaseSize", "NodeGroupDeleteNodes", "NodeGroupDecreaseTargetSize",
    "NodeGroupNodes", "NodeGroupTemplateNodeInfo", "NodeGroupGetOptions",
}  # fmt: skip
CLUSTER = "grpcurl"
TOKEN = "grpcurl-test-token"
WORKERS_RUNNING = 2
GPU_FLAVOR = "gpu2-128-16-1-200"  # the emulator's, with one NVIDIA RTX PRO 6000
GPU_TYPE = "nvidia-rtx-pro-6000-max-q"
GROUPS = [
    {"name": "workers", "minSize": 1, "maxSize": 7, "flavor": "flex-4-2", "image": "debian-12"},
    {"name": "gpu", "minSize": 0, "maxSize": 3, "flavor": GPU_FLAVOR, "image": "debian-12"},
]
START_SECONDS = 30.0
STOP_SECONDS = 15.0


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM (both commands shut down gracefully on it), then SIGKILL if it hangs."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=STOP_SECONDS)


@contextmanager
def background(
    name: str, argv: list[str], log: Path, ready: Callable[[], bool]
) -> Iterator[Process]:
    """Run argv until the end of the `with`; returns once ready() is true."""
    with open(log, "wb") as sink:
        popen = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    process = Process(name, popen, log)
    try:
        deadline = time.monotonic() + START_SECONDS
        while not ready():
            if popen.poll() is not None:
                pytest.fail(f"{name} exited with {popen.returncode}:\n{process.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} not ready after {START_SECONDS}s:\n{process.output()}")
            time.sleep(0.1)
        yield process
    finally:
        process.stop()


def emulator_ready(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            answer = httpx.get(f"{url}/flavors", headers={"Authorization": f"Bearer {TOKEN}"})
        except httpx.TransportError:
            return False
        return answer.status_code == 200

    return ready


def grpc_ready(address: str, certs: Path) -> Callable[[], bool]:
    """Ready = a health check over mTLS with the dev client certificate answers SERVING."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.crt").read_bytes(),
        private_key=(certs / "client.key").read_bytes(),
        certificate_chain=(certs / "client.crt").read_bytes(),
    )

    def ready() -> bool:
        with grpc.secure_channel(address, credentials) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=1.0)
            except grpc.RpcError:
                return False
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    return ready


def write_config(directory: Path, listen: str, cloud_url: str) -> Path:
    token = directory / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    config = {
        "cluster": CLUSTER,
        "listen": listen,
        # Relative paths resolve against the config file's directory: the certs output.
        "tls": {
            "cert": "server.crt",
            "key": "server.key",
            "clientCA": "ca.crt",
            "allowedClients": ["cluster-autoscaler"],
        },
        "cloudscale": {"url": cloud_url, "tokenFile": "token"},
        "nodeGroups": [{**group, "zone": "lpg1"} for group in GROUPS],
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def populate(cloud_url: str) -> None:
    """Servers already in the workers group, so NodeGroupTargetSize has something to count."""
    admin = cloud_url.removesuffix("/v1") + "/_emulator/populate"
    body = {
        "count": WORKERS_RUNNING,
        "tags": {TAG_CLUSTER: CLUSTER, TAG_GROUP: "workers"},
        "flavor": "flex-4-2",
        "image": "debian-12",
        "zone": "lpg1",
    }
    answer = httpx.post(admin, json=body)
    assert answer.status_code in (200, 201), answer.text


@dataclass(frozen=True)
class Deployment:
    address: str
    certs: Path


@pytest.fixture(scope="session")
def grpcurl() -> str:
    return ensure_grpcurl()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """certs + emulator + serve, all through the CLI, for the whole module."""
    work = tmp_path_factory.mktemp("grpcurl")
    certs = work / "certs"
    done = run_cli("certs", "--out", str(certs))
    assert done.returncode == 0, done.stderr
    emulator_port, grpc_port = free_port(), free_port()
    cloud_url = f"http://127.0.0.1:{emulator_port}/v1"
    address = f"127.0.0.1:{grpc_port}"
    config = write_config(certs, address, cloud_url)
    with ExitStack() as stack:
        emulator_argv = [*cli(), "emulator", "--listen", f"127.0.0.1:{emulator_port}"]
        emulator_argv += ["--token", TOKEN, "--boot-seconds", "0"]
        stack.enter_context(
            background("emulator", emulator_argv, work / "emulator.log", emulator_ready(cloud_url))
        )
        populate(cloud_url)
        serve_argv = [*cli(), "serve", "--config", str(config)]
        stack.enter_context(
            background("serve", serve_argv, work / "serve.log", grpc_ready(address, certs))
        )
        yield Deployment(address, certs)


def run_grpcurl(
    grpcurl: str,
    deployment: Deployment,
    *command: str,
    flags: Sequence[str] = (),
    client_cert: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`grpcurl [TLS flags] [flags] ADDRESS command...`, as in the README."""
    certs = deployment.certs
    argv = [grpcurl, "-max-time", "20", "-cacert", str(certs / "ca.crt")]
    if client_cert:
        argv += ["-cert", str(certs / "client.crt"), "-key", str(certs / "client.key")]
    argv += [*flags, deployment.address, *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"grpcurl exit {done.returncode}: {done.stderr}"
    return done.stdout


def test_list_shows_the_provider_and_health_services(grpcurl: str, deployment: Deployment) -> None:
    services = ok(run_grpcurl(grpcurl, deployment, "list")).split()
    assert SERVICE in services
    assert HEALTH in services


def test_describe_shows_the_15_rpcs(grpcurl: str, deployment: Deployment) -> None:
    described = ok(run_grpcurl(grpcurl, deployment, "describe", SERVICE))
    assert f"{SERVICE} is a service" in described
    assert set(re.findall(r"^\s*rpc (\w+) \(", described, flags=re.MULTILINE)) == RPCS


def test_node_groups_returns_the_configured_groups(grpcurl: str, deployment: Deployment) -> None:
    # -emit-defaults: proto3 JSON would otherwise leave out gpu's minSize 0.
    answer = json.loads(
        ok(run_grpcurl(grpcurl, deployment, f"{SERVICE}/NodeGroups", flags=["-emit-defaults"]))
    )
    got = [(g["id"], g["minSize"], g["maxSize"]) for g in answer["nodeGroups"]]
    assert got == [(g["name"], g["minSize"], g["maxSize"]) for g in GROUPS]


def test_node_group_target_size_counts_the_groups_servers(
    grpcurl: str, deployment: Deployment
) -> None:
    request = json.dumps({"id": "workers"})
    answer = ok(
        run_grpcurl(grpcurl, deployment, f"{SERVICE}/NodeGroupTargetSize", flags=["-d", request])
    )
    assert json.loads(answer) == {"targetSize": WORKERS_RUNNING}


def test_gpu_types_print_as_json_without_errors(grpcurl: str, deployment: Deployment) -> None:
    done = run_grpcurl(grpcurl, deployment, f"{SERVICE}/GetAvailableGPUTypes")
    answer = ok(done)
    assert "@error" not in answer and done.stderr == ""
    value = {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": GPU_TYPE}
    assert json.loads(answer) == {"gpuTypes": {GPU_TYPE: value}}


def test_unknown_group_is_not_found(grpcurl: str, deployment: Deployment) -> None:
    request = json.dumps({"id": "nope"})
    done = run_grpcurl(grpcurl, deployment, f"{SERVICE}/NodeGroupTargetSize", flags=["-d", request])
    assert done.returncode != 0
    assert "NotFound" in done.stderr and "nope" in done.stderr


def test_call_without_client_certificate_is_refused(grpcurl: str, deployment: Deployment) -> None:
    done = run_grpcurl(grpcurl, deployment, f"{SERVICE}/NodeGroups", client_cert=False)
    assert done.returncode != 0
    assert "nodeGroups" not in done.stdout
    # Refused in the TLS handshake (grpcurl cannot even connect), not by an RPC status.
    assert "Failed to dial target host" in done.stderr, done.stderr
