"""The image users deploy: built from the Dockerfile with podman (fixtures/image.py, once per
session) and run as the manifests run it: its own user, a read-only root filesystem with an
empty /tmp, no capabilities, config, certificates and token mounted read-only where the
kustomize base mounts them. It serves the emulator's cloud (a separate process on loopback) to
grpcurl over mTLS, answers /metrics, /healthz and /readyz, and drains and exits 0 on SIGTERM.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from fixtures.image import NEEDS_IMAGE, Container, container, image_size, podman
from fixtures.tools import cli, ensure_grpcurl, free_port, run_cli
from test_grpcurl import (
    CLUSTER,
    GROUPS,
    HEALTH,
    SERVICE,
    TOKEN,
    WORKERS_RUNNING,
    Deployment,
    background,
    emulator_ready,
    grpc_ready,
    ok,
    populate,
    run_grpcurl,
)

pytestmark = [pytest.mark.image, NEEDS_IMAGE]

ROOT = Path(__file__).resolve().parents[1]
ETC = Path("/etc/cloudscale-autoscaler")
UID = 10001
START_SECONDS = 60.0
# Kubernetes' default terminationGracePeriodSeconds (the manifests keep it): SIGKILL after it.
GRACE_SECONDS = 30
# An RPC in flight when SIGTERM arrives: its listing is held this long by the emulator.
HELD_LISTING_MS = 3000


@dataclass(frozen=True)
class Cloud:
    url: str
    certs: Path  # ca.crt, client.crt/key for grpcurl; the server's are copied into each mount


@dataclass(frozen=True)
class Served:
    container: Container
    grpc: Deployment
    metrics_url: str


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    """The emulator on loopback with two servers in `workers`, and a development PKI."""
    work = tmp_path_factory.mktemp("image")
    certs = work / "certs"
    done = run_cli("certs", "--out", str(certs))
    assert done.returncode == 0, done.stderr
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    argv = [*cli(), "emulator", "--listen", f"127.0.0.1:{port}", "--token", TOKEN]
    with background("emulator", [*argv, "--boot-seconds", "0"], work / "emulator.log",
                    emulator_ready(url)):  # fmt: skip
        populate(url)
        yield Cloud(url, certs)


def mounts(cloud: Cloud, directory: Path, listen: str, metrics: str) -> list[tuple[Path, str]]:
    """The kustomize base's layout: config.yaml, tls/ and token/ under /etc/cloudscale-autoscaler,
    owned by the image's user (the pod's fsGroup does that in Kubernetes)."""
    tls, token = directory / "tls", directory / "token"
    tls.mkdir(parents=True)
    token.mkdir()
    for source, target in (
        ("server.crt", "tls.crt"),
        ("server.key", "tls.key"),
        ("ca.crt", "ca.crt"),
    ):
        (tls / target).write_bytes((cloud.certs / source).read_bytes())
    (token / "token").write_text(TOKEN)
    config = {
        "cluster": CLUSTER,
        "listen": listen,
        "metrics": {"listen": metrics},
        "tls": {
            "cert": str(ETC / "tls" / "tls.crt"),
            "key": str(ETC / "tls" / "tls.key"),
            "clientCA": str(ETC / "tls" / "ca.crt"),
            "allowedClients": ["cluster-autoscaler"],
        },
        "cloudscale": {"url": cloud.url, "tokenFile": str(ETC / "token" / "token")},
        "nodeGroups": [{**group, "zone": "lpg1"} for group in GROUPS],
    }
    (directory / "config").mkdir()
    (directory / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for path in (directory, *directory.rglob("*")):
        os.chown(path, UID, UID)
        path.chmod(0o700 if path.is_dir() else 0o600)
    return [(directory / "config", str(ETC / "config")),
            (tls, str(ETC / "tls")), (token, str(ETC / "token"))]  # fmt: skip


@contextmanager
def serving(image: str, cloud: Cloud, directory: Path, name: str) -> Iterator[Served]:
    """The image's default command (`serve --config
    /etc/cloudscale-autoscaler/config/config.yaml`) on free loopback ports, once it answers a
    health check over mTLS."""
    address, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    with container(image, name, mounts(cloud, directory, address, metrics)) as running:
        ready = grpc_ready(address, cloud.certs)
        deadline = time.monotonic() + START_SECONDS
        while not ready():
            if running.inspect("{{.State.Running}}") != "true":
                pytest.fail(f"the container exited:\n{running.logs()}")
            if time.monotonic() > deadline:
                pytest.fail(f"not serving after {START_SECONDS}s:\n{running.logs()}")
            time.sleep(0.2)
        yield Served(running, Deployment(address, cloud.certs), f"http://{metrics}")


@pytest.fixture(scope="module")
def served(image: str, cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(
        image, cloud, tmp_path_factory.mktemp("mounts"), "cloudscale-autoscaler-test"
    ) as s:
        yield s


@pytest.fixture(scope="session")
def grpcurl() -> str:
    return ensure_grpcurl()


def test_reflection_lists_the_provider_and_health(grpcurl: str, served: Served) -> None:
    services = ok(run_grpcurl(grpcurl, served.grpc, "list")).split()
    assert {SERVICE, HEALTH} <= set(services)


def test_rpcs_answer_from_the_cloud(grpcurl: str, served: Served) -> None:
    groups = ok(
        run_grpcurl(grpcurl, served.grpc, f"{SERVICE}/NodeGroups", flags=["-emit-defaults"])
    )
    got = [(g["id"], g["minSize"], g["maxSize"]) for g in json.loads(groups)["nodeGroups"]]
    assert got == [(g["name"], g["minSize"], g["maxSize"]) for g in GROUPS]
    ok(run_grpcurl(grpcurl, served.grpc, f"{SERVICE}/Refresh"))
    request = json.dumps({"id": "workers"})
    size = run_grpcurl(
        grpcurl, served.grpc, f"{SERVICE}/NodeGroupTargetSize", flags=["-d", request]
    )
    assert json.loads(ok(size)) == {"targetSize": WORKERS_RUNNING}


def test_a_client_without_certificate_is_refused(grpcurl: str, served: Served) -> None:
    done = run_grpcurl(grpcurl, served.grpc, f"{SERVICE}/NodeGroups", client_cert=False)
    assert done.returncode != 0 and "nodeGroups" not in done.stdout
    assert "Failed to dial target host" in done.stderr, done.stderr


def test_metrics_and_probes(served: Served) -> None:
    assert httpx.get(f"{served.metrics_url}/healthz").status_code == 200
    deadline = time.monotonic() + START_SECONDS
    while (ready := httpx.get(f"{served.metrics_url}/readyz")).status_code != 200:
        assert time.monotonic() < deadline, f"/readyz: {ready.status_code} {ready.text}"
        time.sleep(0.2)
    metrics = httpx.get(f"{served.metrics_url}/metrics")
    assert metrics.status_code == 200
    version = importlib.metadata.version("cloudscale-autoscaler")
    assert f'cloudscale_autoscaler_build_info{{version="{version}"}} 1.0' in metrics.text


def test_runs_as_its_own_user_on_a_read_only_root(image: str, served: Served) -> None:
    assert podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip() == (
        f"{UID}:{UID}"
    )
    # The server itself (PID 1): real, effective, saved and filesystem IDs.
    status = served.container.exec("cat", "/proc/1/status").stdout
    ids = {line.split(":")[0]: line.split()[1:] for line in status.splitlines() if ":" in line}
    assert ids["Uid"] == ids["Gid"] == [str(UID)] * 4, status
    assert served.container.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true"
    written = served.container.exec("sh", "-c", "echo x > /probe")
    assert written.returncode != 0 and "Read-only file system" in written.stderr


# A safety bound, not a measurement: the image was 400 MB (podman images) before it was
# trimmed to one layer of what the server runs (docs/deployment.md, "Building the image").
SIZE_BOUND_BYTES = 200_000_000


def test_the_image_is_at_most_half_its_former_size(image: str) -> None:
    size = image_size(image)
    print(f"image {image}: {size / 1e6:.0f} MB")
    assert size <= SIZE_BOUND_BYTES


def test_no_compiler_or_package_installer_inside(served: Served) -> None:
    tools = "cargo rustc gcc cc c++ ld as make pip pip3 apt-get perl"
    leftovers = "/wheels /src /root/.cargo"
    found = served.container.exec(
        "sh",
        "-c",
        f"for t in {tools}; do command -v $t; done; ls -d {leftovers} 2>/dev/null; true",
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout == "", f"build tools left in the image:\n{found.stdout}"


# Prints {path: sha256} of the installed package's Python files.
DIGESTS = """
import hashlib, json, pathlib, cloudscale_autoscaler as package
top = pathlib.Path(package.__file__).parent
print(json.dumps({str(p.relative_to(top)): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in top.rglob("*.py")}))
"""


def test_the_image_holds_the_working_trees_code(served: Served) -> None:
    """Not a stale install from an earlier build (a layer cache that missed a change)."""
    done = served.container.exec("python3.11", "-c", DIGESTS)
    assert done.returncode == 0, done.stderr
    top = ROOT / "src" / "cloudscale_autoscaler"
    here = {str(p.relative_to(top)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in top.rglob("*.py")}  # fmt: skip
    assert json.loads(done.stdout) == here


def test_sigterm_drains_the_call_in_flight_and_exits_zero(
    image: str, grpcurl: str, cloud: Cloud, tmp_path: Path
) -> None:
    admin = cloud.url.removesuffix("/v1") + "/_emulator"
    with serving(image, cloud, tmp_path / "mounts", "cloudscale-autoscaler-sigterm") as served:
        latency = {"latency": {"list_servers": {"fixed_ms": HELD_LISTING_MS, "jitter_ms": 0}}}
        httpx.put(f"{admin}/faults", json=latency).raise_for_status()
        try:
            client = [
                "-cert",
                str(cloud.certs / "client.crt"),
                "-key",
                str(cloud.certs / "client.key"),
            ]
            argv = [grpcurl, "-max-time", "20", "-cacert", str(cloud.certs / "ca.crt"), *client]
            argv += [served.grpc.address, f"{SERVICE}/Refresh"]
            refresh = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            deadline = time.monotonic() + 10
            while not httpx.get(f"{admin}/stats").json()["in_flight"].get("list_servers"):
                assert time.monotonic() < deadline, "the Refresh never reached the cloud"
                time.sleep(0.05)
            assert refresh.poll() is None, "the Refresh must still wait for the cloud"
            # SIGTERM, then SIGKILL if it still runs after the grace period: the kubelet's way.
            podman(
                "stop",
                "--time",
                str(GRACE_SECONDS),
                served.container.name,
                timeout=GRACE_SECONDS + 30,
            )
            _, err = refresh.communicate(timeout=30)
        finally:
            httpx.put(f"{admin}/faults", json={}).raise_for_status()
        assert refresh.returncode == 0, f"the call in flight was cut: {err}"
        exit_code = served.container.inspect("{{.State.ExitCode}}")
        assert exit_code == "0", f"exit {exit_code}:\n{served.container.logs()}"
