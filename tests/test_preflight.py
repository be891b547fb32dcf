"""`check-config` runs the checks `serve` runs before it listens: every TLS file `serve`
refuses at start, `check-config` refuses too, with the same message (both commands run as
processes, as an operator runs them)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fixtures.tls import with_key
from fixtures.tools import free_port, run_cli

from cloudscale_autoscaler.transport import certs
from cloudscale_autoscaler.transport.certs import Validity

TOKEN = "preflight-test-token-0123456789"
Break = Callable[[Path, certs.DevPKI], None]


def _garbage_cert(tls: Path, pki: certs.DevPKI) -> None:
    (tls / "tls.crt").write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n")


def _garbage_key(tls: Path, pki: certs.DevPKI) -> None:
    (tls / "tls.key").write_text("not a key\n")


def _key_of_another_pair(tls: Path, pki: certs.DevPKI) -> None:
    certs.mint_server(pki.ca).write(tls / "other.crt", tls / "tls.key")


def _garbage_client_ca(tls: Path, pki: certs.DevPKI) -> None:
    (tls / "ca.crt").write_bytes(b"\x00\x01binary junk")


def _expired(tls: Path, pki: certs.DevPKI) -> None:
    certs.mint_server(pki.ca, validity=Validity.expired()).write(tls / "tls.crt", tls / "tls.key")


def _not_yet_valid(tls: Path, pki: certs.DevPKI) -> None:
    issued = certs.mint_server(pki.ca, validity=Validity.not_yet_valid())
    issued.write(tls / "tls.crt", tls / "tls.key")


def _client_cert_as_server(tls: Path, pki: certs.DevPKI) -> None:
    pki.client.write(tls / "tls.crt", tls / "tls.key")


def _p521_key(tls: Path, pki: certs.DevPKI) -> None:
    p521 = ec.generate_private_key(ec.SECP521R1())
    with_key(pki.server, pki.ca, p521).write(tls / "tls.crt", tls / "tls.key")


def _rsa_1024_key(tls: Path, pki: certs.DevPKI) -> None:
    rsa_1024 = rsa.generate_private_key(65537, 1024)
    with_key(pki.server, pki.ca, rsa_1024).write(tls / "tls.crt", tls / "tls.key")


BREAKS: dict[str, tuple[Break, str]] = {
    "garbage-cert": (_garbage_cert, "tls.crt: expected one or more PEM certificates"),
    "garbage-key": (_garbage_key, "tls.key: expected an unencrypted PEM private key"),
    "key-of-another-pair": (_key_of_another_pair, "does not match the certificate"),
    "garbage-client-ca": (_garbage_client_ca, "ca.crt: expected one or more PEM certificates"),
    "expired": (_expired, "tls.crt: expired at"),
    "not-yet-valid": (_not_yet_valid, "tls.crt: not valid before"),
    "client-cert-as-server": (_client_cert_as_server, "lacks serverAuth"),
    # cryptography reads both; the transport's TLS library (rustls, ring) signs with neither.
    "p521-key": (_p521_key, "tls.key: unsupported key"),
    "rsa-1024-key": (_rsa_1024_key, "tls.key: unsupported key"),
}


def write_config(
    directory: Path, pki: certs.DevPKI, kubernetes: dict[str, object] | None = None
) -> Path:
    tls = directory / "tls"
    pki.server.write(tls / "tls.crt", tls / "tls.key")
    pki.ca.write(tls / "ca.crt")
    token = directory / "token"
    token.write_text(TOKEN)
    os.chmod(token, 0o600)
    doc: dict[str, object] = {
        "cluster": "preflight",
        "listen": f"127.0.0.1:{free_port()}",
        "tls": {"cert": "tls/tls.crt", "key": "tls/tls.key", "clientCA": "tls/ca.crt"},
        # Nothing listens there: the provider starts anyway and retries on Refresh.
        "cloudscale": {"url": f"http://127.0.0.1:{free_port()}/v1", "tokenFile": "token"},
        "nodeGroups": [
            {"name": "workers", "minSize": 0, "maxSize": 3, "flavor": "flex-4-2", "image": "d"}
        ],
    }
    if kubernetes is not None:
        doc["kubernetes"] = kubernetes
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def pki() -> certs.DevPKI:
    return certs.mint_dev_pki()


def test_the_unbroken_config_passes_check_config(tmp_path: Path, pki: certs.DevPKI) -> None:
    done = run_cli("check-config", "--config", str(write_config(tmp_path, pki)))
    assert done.returncode == 0, done.stderr
    assert "config OK" in done.stdout


@pytest.mark.parametrize("case", BREAKS)
def test_check_config_refuses_what_serve_refuses(
    case: str, tmp_path: Path, pki: certs.DevPKI
) -> None:
    config = write_config(tmp_path, pki)
    spoil, expected = BREAKS[case]
    spoil(tmp_path / "tls", pki)
    assert_same_refusal(config, expected)


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: not-a-real-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
KUBERNETES: dict[str, tuple[str, dict[str, object], str]] = {
    "garbage-kubeconfig": (
        "kind: [unclosed\n",
        {"kubeconfig": "kubeconfig", "leaderElection": {"enabled": False}},
        "cannot use kubeconfig",
    ),
    "no-lease-namespace": (
        KUBECONFIG,
        {"kubeconfig": "kubeconfig", "leaderElection": {"enabled": True}},
        "kubernetes.leaderElection.namespace: not set",
    ),
}


@pytest.mark.parametrize("case", KUBERNETES)
def test_check_config_refuses_the_kubernetes_settings_serve_refuses(
    case: str, tmp_path: Path, pki: certs.DevPKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    kubeconfig, section, expected = KUBERNETES[case]
    (tmp_path / "kubeconfig").write_text(kubeconfig)
    assert_same_refusal(write_config(tmp_path, pki, kubernetes=section), expected)


def assert_same_refusal(config: Path, expected: str) -> None:
    served = run_cli("serve", "--config", str(config))
    assert served.returncode == 1, served.stderr
    (line,) = [line for line in served.stderr.splitlines() if "cannot start: " in line]
    message = line.split("cannot start: ", 1)[1]
    assert expected in message

    checked = run_cli("check-config", "--config", str(config))
    assert checked.returncode == 2, checked.stdout
    assert "config OK" not in checked.stdout
    assert checked.stderr.splitlines() == [
        f"{config}: invalid config (1 error):",
        f"  {message}",
    ]


# Configs the loader refuses: both commands exit 2 with the same lines (header included).
LOADER_REFUSALS: dict[str, tuple[dict[str, object], str]] = {
    "listen-not-an-ip": (
        {"listen": "999.1.1.1:18086"},
        'listen: invalid address "999.1.1.1:18086": "999.1.1.1" is not an IPv4 address',
    ),
    # .invalid never resolves (RFC 6761).
    "listen-unresolvable": (
        {"listen": "no-such-host.invalid:18086"},
        'listen: invalid address "no-such-host.invalid:18086": cannot resolve',
    ),
    "client-ca-not-a-file": (
        {"tls": {"cert": "tls/tls.crt", "key": "tls/tls.key", "clientCA": "/dev/zero"}},
        "tls.clientCA: not a regular file: /dev/zero",
    ),
}


@pytest.mark.parametrize("case", LOADER_REFUSALS)
def test_serve_and_check_config_refuse_an_invalid_config_alike(
    case: str, tmp_path: Path, pki: certs.DevPKI
) -> None:
    config = write_config(tmp_path, pki)
    change, expected = LOADER_REFUSALS[case]
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), **change}))
    served = run_cli("serve", "--config", str(config))
    checked = run_cli("check-config", "--config", str(config))
    assert (served.returncode, checked.returncode) == (2, 2), (served.stderr, checked.stdout)
    assert served.stderr == checked.stderr
    assert checked.stderr.splitlines()[0] == f"{config}: invalid config (1 error):"
    assert checked.stderr.splitlines()[1].startswith(f"  {expected}")
