"""Development certificates: `cloudscale-autoscaler certs` and the minting functions."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cloudscale_autoscaler.commands.certs import certs_command
from cloudscale_autoscaler.transport import certs
from cloudscale_autoscaler.transport.tls import load_material


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def _sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (
        san.get_values_for_type(x509.DNSName),
        [str(ip) for ip in san.get_values_for_type(x509.IPAddress)],
    )


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_certs_command_writes_a_working_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dev"
    code = certs_command(out, ["autoscaler.kube-system.svc"], ["10.0.0.7"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "ca.crt", "client.crt", "client.key", "server.crt", "server.key",
    ]  # fmt: skip  # no ca.key: see the certs module docstring
    for key in ("server.key", "client.key"):
        assert stat.S_IMODE((out / key).stat().st_mode) == 0o600
    ca, server, client = (_load(out / f"{n}.crt") for n in ("ca", "server", "client"))
    server.verify_directly_issued_by(ca)  # raises if not
    client.verify_directly_issued_by(ca)
    assert _sans(server) == (
        ["localhost", "autoscaler.kube-system.svc"],
        ["127.0.0.1", "::1", "10.0.0.7"],
    )
    assert _eku(server) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert (_cn(client), _sans(client)) == ("cluster-autoscaler", (["cluster-autoscaler"], []))
    assert _eku(client) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    ca_constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert ca_constraints.ca and ca_constraints.path_length == 0
    public_key = server.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert public_key.curve.name == "secp256r1"
    # The server's loader accepts the files as they are.
    material = load_material(out / "server.crt", out / "server.key", out / "ca.crt")
    assert material.leaf.serial_number == server.serial_number
    printed = capsys.readouterr().out
    assert str(out / "server.key") in printed and "autoscaler.kube-system.svc" in printed


def test_certs_command_overwrites_existing_keys_keeping_mode(tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("old")
    key.chmod(0o644)
    assert certs_command(tmp_path, [], []) == 0
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text().startswith("-----BEGIN PRIVATE KEY-----")


@pytest.mark.parametrize(
    ("dns", "ip", "message"),
    [
        (["bad name"], [], "DNS name 'bad name'"),
        (["-leading.example"], [], "DNS name '-leading.example'"),
        ([], ["300.1.1.1"], "IP address '300.1.1.1'"),
        ([], ["localhost"], "IP address 'localhost'"),
    ],
)
def test_certs_command_rejects_bad_names(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    dns: list[str],
    ip: list[str],
    message: str,
) -> None:
    assert certs_command(tmp_path / "out", dns, ip) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("validity", "valid_now"),
    [
        (None, True),
        (certs.Validity.expired(), False),
        (certs.Validity.not_yet_valid(), False),
        (certs.Validity.days(1), True),
    ],
)
def test_validity_windows(validity: certs.Validity | None, valid_now: bool) -> None:
    ca = certs.mint_ca()
    cert = certs.mint_client(ca, "someone", validity=validity).cert
    now = certs._now()
    assert (cert.not_valid_before_utc <= now <= cert.not_valid_after_utc) == valid_now


@pytest.mark.parametrize(
    ("value", "expected"),
    [("Example.COM", "example.com"), ("*.svc.local", "*.svc.local"), ("a", "a")],
)
def test_parse_dns_name(value: str, expected: str) -> None:
    assert certs.parse_dns_name(value) == expected


def test_parse_ip() -> None:
    assert certs.parse_ip(" ::1 ") == ipaddress.ip_address("::1")
