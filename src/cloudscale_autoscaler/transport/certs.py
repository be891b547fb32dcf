"""Development PKI: a throwaway CA plus server and client certificates for mTLS.

`cloudscale-autoscaler certs --out DIR` (commands/certs.py) writes ca.crt, server.crt/.key and
client.crt/.key.
Production clusters get their certificates from cert-manager (see certs/README.md); this module
only exists so that a laptop, the demo and the tests can run the real mTLS path.

The CA's private key is deliberately NOT written: every certificate the development setup needs
is minted in the same run, and a CA key lying around in a working directory would let anyone
who finds it mint a client certificate the server accepts. To add names or rotate, run `certs`
again: it mints a fresh CA and replaces all files.

Keys are ECDSA P-256 (small, fast handshakes, accepted by Go's crypto/tls that CA uses).
The validity window is a parameter so tests can mint expired and not-yet-valid certificates.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_CA_NAME = "cloudscale-autoscaler development CA"
DEFAULT_SERVER_NAME = "cloudscale-autoscaler"
DEFAULT_CLIENT_NAME = "cluster-autoscaler"
# Loopback names every server certificate carries, so local clients can verify it.
LOOPBACK_DNS = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")
CA_DAYS = 3650
LEAF_DAYS = 825
# Backdate notBefore a little so a client whose clock is slightly behind still accepts it.
CLOCK_SKEW = dt.timedelta(minutes=5)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DNS_NAME = re.compile(
    r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


class CertError(ValueError):
    """A bad name or address given for a certificate."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, cert_path: Path, key_path: Path | None = None) -> None:
        """Write the certificate (mode 0644) and, if given a path, the key (mode 0600)."""
        write_file(cert_path, self.cert_pem(), 0o644)
        if key_path is not None:
            write_file(key_path, self.key_pem(), 0o600)


@dataclass(frozen=True)
class Validity:
    """A notBefore/notAfter window; `Validity.days(n)` is the usual "from now" form."""

    not_before: dt.datetime
    not_after: dt.datetime

    @classmethod
    def days(cls, days: float, *, start: dt.datetime | None = None) -> Validity:
        begin = start if start is not None else _now() - CLOCK_SKEW
        return cls(begin, begin + dt.timedelta(days=days))

    @classmethod
    def expired(cls) -> Validity:
        """A window that ended yesterday."""
        now = _now()
        return cls(now - dt.timedelta(days=10), now - dt.timedelta(days=1))

    @classmethod
    def not_yet_valid(cls) -> Validity:
        """A window that starts tomorrow."""
        now = _now()
        return cls(now + dt.timedelta(days=1), now + dt.timedelta(days=10))


def _now() -> dt.datetime:
    # X.509 has one-second resolution; dropping microseconds keeps round trips exact.
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def parse_dns_name(name: str) -> str:
    """Validate a DNS SAN (optionally a leading wildcard label); returns it lower-cased."""
    lowered = name.strip().lower()
    if len(lowered) > 253 or not _DNS_NAME.match(lowered):
        raise CertError(f"DNS name {name!r}: expected a hostname such as 'autoscaler.example'")
    return lowered


def parse_ip(value: str) -> IPAddress:
    try:
        return ipaddress.ip_address(value.strip())
    except ValueError:
        raise CertError(f"IP address {value!r}: expected an IPv4 or IPv6 address") from None


def mint_ca(common_name: str = DEFAULT_CA_NAME, *, validity: Validity | None = None) -> Issued:
    """A self-signed CA that may sign leaf certificates only (pathLen 0)."""
    key = new_key()
    window = validity or Validity.days(CA_DAYS)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        _base_builder(name, name, key, window)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), False)
    )
    return Issued(builder.sign(key, hashes.SHA256()), key)


def mint_leaf(
    ca: Issued,
    common_name: str,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    usages: Iterable[x509.ObjectIdentifier],
    validity: Validity | None = None,
) -> Issued:
    """A certificate signed by `ca` for `common_name` with the given SANs and extended usages."""
    key = new_key()
    window = validity or Validity.days(LEAF_DAYS)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        _base_builder(subject, ca.cert.subject, key, window)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
    )
    sans = _subject_alt_names(dns, ips)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def mint_server(
    ca: Issued,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    common_name: str = DEFAULT_SERVER_NAME,
    validity: Validity | None = None,
) -> Issued:
    """A serverAuth certificate for the loopback names plus `dns` and `ips`."""
    dns_names, ip_names = server_sans(dns, ips)
    return mint_leaf(
        ca,
        common_name,
        dns=dns_names,
        ips=ip_names,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        validity=validity,
    )


def server_sans(dns: Sequence[str], ips: Sequence[str]) -> tuple[list[str], list[str]]:
    """The server certificate's DNS and IP SANs: the loopback names, then `dns` and `ips`,
    each name once."""
    return _unique([*LOOPBACK_DNS, *dns]), _unique([*LOOPBACK_IPS, *ips])


def mint_client(
    ca: Issued,
    name: str = DEFAULT_CLIENT_NAME,
    *,
    validity: Validity | None = None,
    dns: Sequence[str] | None = None,
) -> Issued:
    """A clientAuth certificate whose CN is `name` and whose DNS SAN is `name` (or `dns`)."""
    return mint_leaf(
        ca,
        name,
        dns=[name] if dns is None else dns,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        validity=validity,
    )


def _base_builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, window: Validity
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(window.not_before)
        .not_valid_after(window.not_after)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    # ECDSA leaves only sign (the TLS 1.2/1.3 handshake); the CA only signs certificates.
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _subject_alt_names(dns: Sequence[str], ips: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(parse_dns_name(d)) for d in dns]
    names += [x509.IPAddress(parse_ip(i)) for i in ips]
    return names


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write `data` so that the file never exists with wider permissions than `mode`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode does not apply to an existing file
        os.write(fd, data)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class DevPKI:
    ca: Issued
    server: Issued
    client: Issued


def mint_dev_pki(dns: Sequence[str] = (), ips: Sequence[str] = ()) -> DevPKI:
    ca = mint_ca()
    return DevPKI(ca, mint_server(ca, dns=dns, ips=ips), mint_client(ca))
