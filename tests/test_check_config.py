"""`cloudscale-autoscaler check-config [--online]`: exit codes and what it prints."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.x509.oid import ExtendedKeyUsageOID
from fixtures.emulator import TOKEN as EMULATOR_TOKEN
from fixtures.emulator import RunningEmulator
from fixtures.tools import cli, free_port

from cloudscale_autoscaler.cli import main
from cloudscale_autoscaler.cloud.models import Flavor, Image, Region
from cloudscale_autoscaler.engine.catalogue_check import catalogue_errors
from cloudscale_autoscaler.settings.types import NodeGroupConfig
from cloudscale_autoscaler.transport.certs import (
    DevPKI,
    Validity,
    mint_dev_pki,
    mint_leaf,
    mint_server,
)

SECRET = "check-config-secret-token-0123456789"


@functools.cache
def _dev_pki() -> DevPKI:
    return mint_dev_pki()


def write_config(
    tmp_path: Path,
    groups: list[dict[str, Any]] | None = None,
    url: str = "http://127.0.0.1:8087/v1",
    token: str = SECRET,
    **top: Any,
) -> Path:
    tls = tmp_path / "tls"
    tls.mkdir(exist_ok=True)
    pki = _dev_pki()
    pki.server.write(tls / "server.crt", tls / "server.key")
    pki.ca.write(tls / "ca.crt")
    (tmp_path / "token").write_text(token + "\n")
    os.chmod(tmp_path / "token", 0o600)
    doc: dict[str, Any] = {
        "cluster": "prod",
        "tls": {"cert": "tls/server.crt", "key": "tls/server.key", "clientCA": "tls/ca.crt"},
        "cloudscale": {"url": url, "tokenFile": "token"},
        "stateDir": "state",
        "nodeGroups": groups
        or [
            {
                "name": "workers",
                "minSize": 1,
                "maxSize": 5,
                "flavor": "flex-8-4",
                "image": "debian-12",
                "zone": "lpg1",
                "volumeSizeGB": 50,
                "labels": {"role": "worker", "tier": "a"},
                "taints": ["dedicated=x:NoSchedule"],
                "autoscalingOptions": {"scaleDownUnneededTime": "5m"},
            },
            {"name": "spare", "minSize": 0, "maxSize": 2, "flavor": "flex-4-1", "image": "d"},
        ],
        **top,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_valid_config_prints_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, metrics={"listen": "127.0.0.1:9090"})
    assert main(["check-config", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    tls = tmp_path / "tls"
    assert out.splitlines() == [
        f"{path}: config OK",
        "cluster:            prod",
        "listen:             0.0.0.0:8086",
        f"tls:                mTLS, cert {tls}/server.crt, client CA {tls}/ca.crt, "
        "allowed clients: any certificate the CA signed",
        "metrics:            127.0.0.1:9090",
        "api url:            http://127.0.0.1:8087/v1",
        f"api token:          from file {tmp_path}/token",
        "api limits:         timeout 30s, 10 concurrent creates, rate unlimited",
        "gpu label:          cloudscale.ch/gpu",
        "placeholder expiry: 900s",
        "pricing:            none (the pricing RPCs answer UNIMPLEMENTED)",
        "kubernetes:         disabled (no drift checks, no leader election)",
        f"creation journal:   file {tmp_path / 'state' / 'creations.json'} (stateDir)",
        "node groups (2):",
        "  workers: size 1-5, flavor flex-8-4, image debian-12, zone lpg1, volume 50 GB, "
        "2 labels, 1 taint, options: yes, interfaces: public",
        "  spare: size 0-2, flavor flex-4-1, image d, zone (project default), volume 10 GB, "
        "0 labels, 0 taints, options: no, interfaces: public",
    ]
    # Valid, with warnings: labels and taints without userData, and autoscalingOptions.
    warnings = err.splitlines()
    assert [w.split(":")[0] for w in warnings] == ["warning"] * 3
    assert "nodeGroups[0] (workers): has labels but it has no userData for" in warnings[0]
    assert "nodeGroups[0] (workers): has taints but it has no userData for" in warnings[1]
    assert "node group(s) workers set autoscalingOptions" in warnings[2]
    assert "kubernetes/autoscaler#10245" in warnings[2]
    assert SECRET not in out


def test_insecure_and_env_token_in_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path, tls={"insecure": True})
    doc = yaml.safe_load(path.read_text())
    del doc["cloudscale"]["tokenFile"]
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("CLOUDSCALE_API_TOKEN", SECRET)
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "tls:                INSECURE: plaintext gRPC, no client authentication" in out
    assert "api token:          from the CLOUDSCALE_API_TOKEN environment variable" in out
    assert SECRET not in out


def test_invalid_config_prints_every_error_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    groups = [
        {"name": "a", "minSize": 4, "maxSize": 2, "flavor": "f", "image": "i"},
        {"name": "a", "minSize": 0, "maxSize": 1, "flavour": "f", "image": "i"},
    ]
    path = write_config(tmp_path, groups)
    assert main(["check-config", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}: invalid config (4 errors):",
        "  nodeGroups[0].maxSize: must be >= minSize (4)",
        '  nodeGroups[1].flavour: unknown key; did you mean "flavor"?',
        "  nodeGroups[1].flavor: required",
        '  nodeGroups[1].name: duplicate of nodeGroups[0].name "a"',
    ]


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "absent.yaml"
    assert main(["check-config", "--config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: invalid config (1 error):",
        f"  {path}: cannot read: No such file or directory",
    ]


# --- one pass: the loader's problems and what serve checks before it listens, together ------


def test_tls_file_problems_come_with_the_other_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """configuration.md: every problem is reported at once. An expired certificate is not
    held back until the rest of the file is right."""
    groups = [{"name": "a", "minSize": 4, "maxSize": 2, "flavor": "f", "image": "i"}]
    path = write_config(tmp_path, groups, kubernetes={})
    tls = tmp_path / "tls"
    expired = mint_server(_dev_pki().ca, validity=Validity.expired())
    expired.write(tls / "server.crt", tls / "server.key")
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["check-config", "--config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == [
        f"{path}: invalid config (3 errors):",
        "  nodeGroups[0].maxSize: must be >= minSize (4)",
    ]
    assert lines[2].startswith(f"  tls.cert {tls}/server.crt: expired at ")
    assert lines[3] == (
        "  kubernetes.kubeconfig: not set, so the in-cluster service account is used, but this "
        "process runs outside a Pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT not "
        "set): set kubernetes.kubeconfig to a kubeconfig file, or run it in a Pod"
    )


def test_a_tls_file_the_loader_refused_is_not_read_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, listen="127.0.0.1:1")
    (tmp_path / "tls" / "ca.crt").unlink()
    assert main(["check-config", "--config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: invalid config (1 error):",
        f"  tls.clientCA: file not found: {tmp_path}/tls/ca.crt",
    ]


# --- TLS files the Cluster Autoscaler would refuse, as real processes ------------------------


def tls_refused_by_ca(tmp_path: Path, broken: str) -> tuple[Path, str]:
    """A config whose server certificate has no SAN, or whose clientCA is a leaf; and the
    error naming the file."""
    path = write_config(tmp_path, listen=f"127.0.0.1:{free_port()}")
    tls = tmp_path / "tls"
    if broken == "server-without-san":
        pki = _dev_pki()
        issued = mint_leaf(pki.ca, "localhost", usages=[ExtendedKeyUsageOID.SERVER_AUTH])
        issued.write(tls / "server.crt", tls / "server.key")
        return path, (
            f"tls.cert {tls}/server.crt: has no DNS or IP subject alternative name, so the "
            'Cluster Autoscaler refuses it ("x509: certificate relies on legacy Common Name '
            'field"): it checks the host of `address` in its cloud-config against these '
            "names; add that host as a SAN"
        )
    _dev_pki().client.write(tls / "ca.crt")
    return path, (
        f"tls.clientCA {tls}/ca.crt: holds no CA certificate (basicConstraints CA:TRUE), so no "
        "client certificate can be verified against it and every client would be refused; "
        "give the CA that signs the Cluster Autoscaler's client certificate"
    )


@pytest.mark.parametrize("broken", ["server-without-san", "leaf-as-client-ca"])
def test_check_config_refuses_tls_files_ca_would_refuse(tmp_path: Path, broken: str) -> None:
    path, error = tls_refused_by_ca(tmp_path, broken)
    done = subprocess.run(
        cli("check-config", "--config", str(path)), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"{path}: invalid config (1 error):", f"  {error}"]


@pytest.mark.parametrize("broken", ["server-without-san", "leaf-as-client-ca"])
def test_serve_refuses_tls_files_ca_would_refuse(tmp_path: Path, broken: str) -> None:
    path, error = tls_refused_by_ca(tmp_path, broken)
    done = subprocess.run(
        cli("serve", "--config", str(path)), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert f"ERROR cloudscale_autoscaler.app: cannot start: {error}\n" in done.stderr
    assert "gRPC server listening" not in done.stderr


# --- the catalogue comparison (pure) ---------------------------------------------------------

FLAVORS = [
    Flavor("flex-4-1", "Flex-4-1", 1, 4.0, zones=("lpg1", "rma1")),
    Flavor("gpu-1", "GPU", 16, 128.0, zones=("rma1",)),
    Flavor("nozones", "No zones listed", 2, 8.0),
]
IMAGES = [
    Image("debian-12", "Debian 12", zones=("lpg1", "rma1")),
    Image("old", "Old", zones=("rma1",)),
]
REGIONS = [Region("lpg", ("lpg1",)), Region("rma", ("rma1",))]


def grp(
    flavor: str = "flex-4-1", image: str = "debian-12", zone: str | None = "lpg1"
) -> NodeGroupConfig:
    return NodeGroupConfig("g", 0, 1, flavor, image, zone)


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        (grp(), []),
        (grp(zone=None), []),
        (grp(flavor="nozones"), []),
        (grp(image="custom:my-image"), []),
        (grp(image="0d0bd2a4-5de3-4bb4-8bde-3c3e5b8fa4f7"), []),
        (
            grp(flavor="flex-9-9"),
            ['nodeGroups[0].flavor: unknown flavor "flex-9-9" (known: flex-4-1, gpu-1, nozones)'],
        ),
        (grp(image="arch"), ['nodeGroups[0].image: unknown image "arch" (known: debian-12, old)']),
        (grp(zone="xyz1"), ['nodeGroups[0].zone: unknown zone "xyz1" (known: lpg1, rma1)']),
        (
            grp(flavor="gpu-1", image="old"),
            [
                'nodeGroups[0].flavor: flavor "gpu-1" is not available in zone "lpg1" '
                "(available in: rma1)",
                'nodeGroups[0].image: image "old" is not available in zone "lpg1" '
                "(available in: rma1)",
            ],
        ),
    ],
    ids=[
        "ok",
        "no zone",
        "flavor without zones",
        "custom image",
        "image uuid",
        "flavor",
        "image",
        "zone",
        "not in zone",
    ],
)
def test_catalogue_errors(group: NodeGroupConfig, expected: list[str]) -> None:
    assert catalogue_errors([group], FLAVORS, IMAGES, REGIONS) == expected


# --- --online against the emulator ---------------------------------------------------------


async def check_online(path: Path) -> int:
    """Runs the command in a worker thread: it starts its own event loop with asyncio.run,
    while this test's loop keeps serving the emulator."""
    return await asyncio.to_thread(main, ["check-config", "--config", str(path), "--online"])


def failure_lines(err: str, url: str) -> list[str]:
    """The command's own report: from its headline on (the client's retry warnings, logged
    to stderr before it, are not part of the contract)."""
    lines = err.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(f"online check against {url}")]
    assert starts, err
    return lines[starts[0] :]


async def test_online_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], emulator: RunningEmulator
) -> None:
    groups = [
        {
            "name": "a",
            "minSize": 0,
            "maxSize": 1,
            "flavor": "flex-8-4",
            "image": "debian-12",
            "zone": "lpg1",
        },
        {
            "name": "gpu",
            "minSize": 0,
            "maxSize": 1,
            "flavor": "gpu2-128-16-1-200",
            "image": "custom:my-image",
            "zone": "rma1",
            "userData": "#cloud-config\n# --node-labels=${node_labels}\n",
        },
    ]
    path = write_config(tmp_path, groups, url=emulator.url, token=EMULATOR_TOKEN)
    assert await check_online(path) == 0
    out, err = capsys.readouterr()
    last = out.splitlines()[-1]
    assert last.startswith(f"online check against {emulator.url}: OK (")
    assert "zones lpg1, rma1" in last
    assert err == ""


async def test_online_reports_unknown_flavor_image_and_zone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], emulator: RunningEmulator
) -> None:
    groups = [
        {"name": "a", "minSize": 0, "maxSize": 1, "flavor": "flex-9-9", "image": "debian-12"},
        {
            "name": "b",
            "minSize": 0,
            "maxSize": 1,
            "flavor": "flex-4-1",
            "image": "beos",
            "zone": "zrh9",
        },
        {
            "name": "c",
            "minSize": 0,
            "maxSize": 1,
            "flavor": "gpu2-128-16-1-200",
            "image": "ubuntu-20.04",
            "zone": "lpg1",
        },
    ]
    path = write_config(tmp_path, groups, url=emulator.url, token=EMULATOR_TOKEN)
    assert await check_online(path) == 2
    err = failure_lines(capsys.readouterr().err, emulator.url)
    assert err[0] == f"online check against {emulator.url} (5 errors):"
    assert err[1].startswith('  nodeGroups[0].flavor: unknown flavor "flex-9-9" (known: flex-16-4,')
    assert err[2].startswith('  nodeGroups[1].image: unknown image "beos" (known: debian-11,')
    assert err[3:] == [
        '  nodeGroups[1].zone: unknown zone "zrh9" (known: lpg1, rma1)',
        '  nodeGroups[2].flavor: flavor "gpu2-128-16-1-200" is not available in zone "lpg1" '
        "(available in: rma1)",
        '  nodeGroups[2].image: image "ubuntu-20.04" is not available in zone "lpg1" '
        "(available in: rma1)",
    ]


async def test_online_rejected_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], emulator: RunningEmulator
) -> None:
    path = write_config(tmp_path, url=emulator.url, token=SECRET)
    assert await check_online(path) == 2
    out, err = capsys.readouterr()
    lines = failure_lines(err, emulator.url)
    assert lines[0] == f"online check against {emulator.url} failed (1 error):"
    assert lines[1].startswith(
        f"  cloudscale: the API rejected the token (from file {tmp_path}/token): "
    )
    assert SECRET not in out + err


async def test_online_api_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], emulator: RunningEmulator
) -> None:
    await emulator.admin.set_faults({"down": True})
    path = write_config(tmp_path, url=emulator.url, token=EMULATOR_TOKEN)
    assert await check_online(path) == 2
    lines = failure_lines(capsys.readouterr().err, emulator.url)
    assert lines[0] == f"online check against {emulator.url} failed (1 error):"
    assert lines[1].startswith(
        "  cloudscale.url: the API is unreachable or failing: list_flavors: HTTP 503: "
    )
    assert len(lines) == 2


async def test_online_nothing_listening(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], emulator: RunningEmulator
) -> None:
    url = emulator.url
    await emulator.stop()  # a port that was just ours, now closed
    path = write_config(tmp_path, url=url, token=EMULATOR_TOKEN)
    assert await check_online(path) == 2
    lines = failure_lines(capsys.readouterr().err, url)
    assert lines[0] == f"online check against {url} failed (1 error):"
    assert lines[1].startswith("  cloudscale.url: the API is unreachable or failing: list_flavors")


def test_online_invalid_config_never_calls_the_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, [{"name": "x", "minSize": 0}])
    assert main(["check-config", "--config", str(path), "--online"]) == 2
    err = capsys.readouterr().err
    assert "online check" not in err
    assert "nodeGroups[0].maxSize: required" in err
