"""Server-side mTLS with certificate reload.

cert-manager renews the server certificate by rewriting the files of the mounted Secret. The
transport asks before every new TLS handshake (transport/server.py); `refresh` stats the three
files at most once per `min_interval` seconds and, when one changed and the new set is valid,
makes it the material handed to the transport. Established connections keep the
certificate they negotiated (TLS checks validity only during the handshake), so rotation needs
no restart and drops no RPC. An invalid intermediate state (a key that no longer matches the
certificate halfway through a non-atomic copy) is logged once and skipped: the last good
configuration stays in use until the files are consistent again.

`load_material` is the one place the files are checked, for what the Cluster Autoscaler's Go
TLS would refuse too (a server certificate without a DNS or IP SAN, a client CA bundle without
a CA certificate): `serve` calls it before it listens and on every reload, `check-config`
calls it too, so a file one refuses the other refuses with the same message. Its last check
builds the transport's own TLS configuration (`_transport.check_tls`): rustls signs with fewer
key types than cryptography reads (no P-521, no RSA under 2048 bits), and what it refuses must
be refused here, not at the next handshake.

Client certificates are always required and verified against `clientCA` (a PEM bundle, also
reloaded). rustls in the transport checks the client certificate's extended key usage (a
serverAuth-only certificate is refused) and negotiates TLS 1.2 or newer only;
tests/test_transport_tls.py pins both behaviours.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from cloudscale_autoscaler import _transport
from cloudscale_autoscaler.config.yamlfile import MAX_DOCUMENT_BYTES, read_at_most

log = logging.getLogger(__name__)

DEFAULT_MIN_INTERVAL = 1.0


class TLSFileError(Exception):
    """A certificate, key or CA bundle that cannot be used; the message names the file."""


@dataclass(frozen=True)
class TLSMaterial:
    """A validated server certificate chain, its key and the client CA bundle (all PEM)."""

    cert_chain: bytes
    key: bytes
    client_ca: bytes
    leaf: x509.Certificate

    @property
    def not_after(self) -> float:
        """The leaf certificate's notAfter as a Unix timestamp."""
        return self.leaf.not_valid_after_utc.timestamp()


def _read(path: Path, what: str) -> bytes:
    """Bounded and regular files only, as the config's other files: a rotation that leaves
    a FIFO in place must not block the handshake that checks for new files."""
    try:
        data = read_at_most(path, MAX_DOCUMENT_BYTES)
    except OSError as exc:
        raise TLSFileError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    if data is None:
        raise TLSFileError(f"{what} {path}: larger than {MAX_DOCUMENT_BYTES // 1024} KiB")
    return data


def _certificates(data: bytes, path: Path, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise TLSFileError(f"{what} {path}: expected one or more PEM certificates")
    return certs


def _public_key_der(key: object) -> bytes:
    public = key.public_key()  # type: ignore[attr-defined]
    der: bytes = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


_USAGE_NAMES = {
    ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth",
    ExtendedKeyUsageOID.CODE_SIGNING: "codeSigning",
    ExtendedKeyUsageOID.EMAIL_PROTECTION: "emailProtection",
    ExtendedKeyUsageOID.TIME_STAMPING: "timeStamping",
    ExtendedKeyUsageOID.OCSP_SIGNING: "OCSPSigning",
}


def _leaf_problem(leaf: x509.Certificate, now: dt.datetime) -> str | None:
    """Why clients would refuse this server certificate, if they would."""
    if now < leaf.not_valid_before_utc:
        return f"not valid before {leaf.not_valid_before_utc.isoformat()}"
    if now > leaf.not_valid_after_utc:
        return f"expired at {leaf.not_valid_after_utc.isoformat()}"
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return None  # no restriction: any usage
    if {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE} & set(usages):
        return None
    names = ", ".join(_USAGE_NAMES.get(oid, oid.dotted_string) for oid in usages) or "none"
    return f"extended key usage ({names}) lacks serverAuth: not a server certificate"


def _names_problem(leaf: x509.Certificate) -> str | None:
    """Go's TLS (the Cluster Autoscaler's) matches the host it dials against the DNS and IP
    subject alternative names only, never the Common Name."""
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names = x509.SubjectAlternativeName([])
    if names.get_values_for_type(x509.DNSName) or names.get_values_for_type(x509.IPAddress):
        return None
    return (
        "has no DNS or IP subject alternative name, so the Cluster Autoscaler refuses it "
        '("x509: certificate relies on legacy Common Name field"): it checks the host of '
        "`address` in its cloud-config against these names; add that host as a SAN"
    )


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        return certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def load_material(cert: Path, key: Path, client_ca: Path) -> TLSMaterial:
    """Read and check the files as clients will (PEM, key pair, a CA in the CA bundle, the
    certificate's validity window now, its usage and its names) and as the transport will
    (its TLS configuration built from them); raises TLSFileError naming the file at fault."""
    chain = _read(cert, "tls.cert")
    key_pem = _read(key, "tls.key")
    ca_pem = _read(client_ca, "tls.clientCA")
    leaf = _certificates(chain, cert, "tls.cert")[0]
    if not any(_is_ca(ca) for ca in _certificates(ca_pem, client_ca, "tls.clientCA")):
        raise TLSFileError(
            f"tls.clientCA {client_ca}: holds no CA certificate (basicConstraints CA:TRUE), "
            "so no client certificate can be verified against it and every client would be "
            "refused; give the CA that signs the Cluster Autoscaler's client certificate"
        )
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TLSFileError(
            f"tls.key {key}: expected an unencrypted PEM private key ({exc})"
        ) from None
    if _public_key_der(private) != _public_key_der(leaf):
        raise TLSFileError(
            f"tls.key {key}: does not match the certificate in tls.cert {cert} "
            "(a key and certificate from different pairs)"
        )
    problem = _leaf_problem(leaf, dt.datetime.now(dt.UTC))
    if problem is not None:
        raise TLSFileError(f"tls.cert {cert}: {problem}; clients refuse it")
    problem = _names_problem(leaf)
    if problem is not None:
        raise TLSFileError(f"tls.cert {cert}: {problem}")
    try:
        _transport.check_tls(chain, key_pem, ca_pem)
    except ValueError as exc:
        field, reason = exc.args
        path = {"tls.cert": cert, "tls.key": key, "tls.clientCA": client_ca}[field]
        raise TLSFileError(f"{field} {path}: {reason}") from None
    return TLSMaterial(chain, key_pem, ca_pem, leaf)


Signature = tuple[tuple[int, int, int, int], ...]


def _signature(paths: tuple[Path, ...]) -> Signature:
    """What changes when a file is rewritten or a Secret's symlink is swapped; raises OSError
    (with the file's name) when one is missing."""
    stats = [os.stat(p) for p in paths]
    return tuple((s.st_dev, s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)


class ReloadingCredentials:
    """Owns the server's TLS files and the newest valid material loaded from them."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        client_ca: Path,
        *,
        min_interval: float = DEFAULT_MIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._paths = (cert, key, client_ca)
        self._min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        try:  # before loading: a change in between is then seen by the next check
            seen: Signature | None = _signature(self._paths)
        except OSError:
            seen = None  # load_material names the missing file
        self._material = load_material(cert, key, client_ca)
        self._seen = seen
        self._failed: object = None  # the last unusable state, logged once
        self._checked_at = clock()

    @property
    def min_interval(self) -> float:
        return self._min_interval

    @property
    def material(self) -> TLSMaterial:
        """The newest valid material (what the next handshake will present)."""
        return self._material

    def refresh(self, *, force: bool = False) -> bool:
        """Reload if the files changed (at most once per min_interval unless forced: the
        transport keeps to min_interval itself).

        Returns True when new material was loaded. Never raises: a bad state is logged and the
        previous material stays in use.
        """
        now = self._clock()
        if not force and now - self._checked_at < self._min_interval:
            return False
        # Handshakes may call in concurrently; one check at a time is enough.
        if not self._lock.acquire(blocking=force):
            return False
        try:
            self._checked_at = now
            return self._reload_if_changed()
        finally:
            self._lock.release()

    def _reload_if_changed(self) -> bool:
        try:
            signature = _signature(self._paths)
        except OSError as exc:
            # cert-manager swaps a Secret's files atomically; a file that stays missing is a
            # mistake worth one line, not one per handshake.
            self._unusable(("missing", exc.filename), f"{exc.filename}: {exc.strerror}")
            return False
        if signature == self._seen:
            return False
        try:
            material = load_material(*self._paths)
        except TLSFileError as exc:
            self._unusable(signature, str(exc))
            return False
        self._failed = None
        self._seen = signature
        current = self._material
        if (material.cert_chain, material.key, material.client_ca) == (
            current.cert_chain,
            current.key,
            current.client_ca,
        ):
            return False
        self._material = material
        log.info(
            "loaded new TLS certificate",
            extra={"serial": f"{material.leaf.serial_number:x}", "not_after": _iso(material)},
        )
        return True

    def _unusable(self, state: object, reason: str) -> None:
        if state != self._failed:
            self._failed = state
            log.warning("TLS files changed but are not usable; keeping the previous: %s", reason)


def _iso(material: TLSMaterial) -> str:
    return material.leaf.not_valid_after_utc.isoformat()
