"""mTLS on the real gRPC server: who gets in, certificate reload, TLS version floor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import threading
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from fixtures.tls import (
    PKI,
    CertFiles,
    address,
    client_ssl_context,
    grpc_channel,
    make_config,
    other_ca,
    serving,
    with_key,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.transport.certs import Issued, Validity, mint_leaf
from cloudscale_autoscaler.transport.clients import AllowedClients
from cloudscale_autoscaler.transport.server import RunningServer
from cloudscale_autoscaler.transport.tls import ReloadingCredentials, TLSFileError, load_material

TIMEOUT = 10.0


async def node_groups(channel: grpc.aio.Channel) -> pb.NodeGroupsResponse:
    return await pb_grpc.CloudProviderStub(channel).NodeGroups(
        pb.NodeGroupsRequest(), timeout=TIMEOUT
    )


async def test_valid_client_calls_node_groups_and_cleanup(pki: PKI) -> None:
    config = make_config(pki)
    async with serving(config) as running, grpc_channel(pki, address(running)) as channel:
        groups = await node_groups(channel)
        await pb_grpc.CloudProviderStub(channel).Cleanup(pb.CleanupRequest(), timeout=TIMEOUT)
    assert [(g.id, g.minSize, g.maxSize) for g in groups.nodeGroups] == [
        ("workers", 1, 7),
        ("gpu", 0, 3),
    ]


def _no_cert(pki: PKI) -> CertFiles | None:
    return None


def _other_ca(pki: PKI) -> CertFiles | None:
    return pki.client(ca=other_ca())


def _expired(pki: PKI) -> CertFiles | None:
    return pki.client(validity=Validity.expired())


def _not_yet_valid(pki: PKI) -> CertFiles | None:
    return pki.client(validity=Validity.not_yet_valid())


def _server_cert_as_client(pki: PKI) -> CertFiles | None:
    # Signed by the right CA, but its extended key usage is serverAuth only.
    return pki.server()


@pytest.mark.parametrize(
    "make_client",
    [_no_cert, _other_ca, _expired, _not_yet_valid, _server_cert_as_client],
    ids=["no-client-cert", "other-ca", "expired", "not-yet-valid", "server-cert-as-client"],
)
async def test_handshake_refuses_bad_client_certificates(pki: PKI, make_client: object) -> None:
    client = make_client(pki)  # type: ignore[operator]
    async with serving(make_config(pki)) as running:
        bad = grpc_channel(
            pki, address(running), client=client, with_client_cert=client is not None
        )
        async with bad:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await node_groups(bad)
        # Control: the same server admits the legitimate client.
        async with grpc_channel(pki, address(running)) as good:
            assert len((await node_groups(good)).nodeGroups) == 2
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_allowed_clients_by_cn_or_dns_san(pki: PKI) -> None:
    config = make_config(pki, allowed_clients=["cluster-autoscaler"])
    intruder = pki.client("intruder")
    san_only = pki.client("renamed", dns=["renamed", "cluster-autoscaler"])
    async with serving(config) as running:
        target = address(running)
        async with grpc_channel(pki, target) as channel:
            assert len((await node_groups(channel)).nodeGroups) == 2
        async with grpc_channel(pki, target, client=san_only) as channel:
            assert len((await node_groups(channel)).nodeGroups) == 2
        async with grpc_channel(pki, target, client=intruder) as channel:
            for _ in range(2):  # the second answer comes from the decision cache
                with pytest.raises(grpc.aio.AioRpcError) as denied:
                    await node_groups(channel)
                assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "'intruder'" in (denied.value.details() or "")
            # Health stays open to any client the CA vouches for (monitoring).
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    ("cns", "dns", "allowed"),
    [
        (["cluster-autoscaler"], [], True),
        (["Cluster-Autoscaler"], [], True),
        (["x"], ["a", "cluster-autoscaler"], True),
        ([], ["ops"], True),
        (["x"], ["y"], False),
        (["cluster-autoscaler.evil"], [], False),
        ([], [], False),
    ],
)
def test_allowed_clients_decision(cns: list[str], dns: list[str], allowed: bool) -> None:
    check = AllowedClients(["cluster-autoscaler", "ops"])
    decision = check.decide(cns, dns)
    assert (decision is None) == allowed
    assert check.decide(cns, dns) == decision  # cached answer is the same


def test_allowed_clients_denial_names_the_client() -> None:
    check = AllowedClients(["cluster-autoscaler"])
    message = check.decide(["mallory"], ["m.example"])
    assert message is not None
    assert "'mallory'" in message and "m.example" in message
    # The allowed names are not revealed to the refused client.
    assert "cluster-autoscaler" not in message


def test_allowed_clients_denial_is_bounded() -> None:
    """A certificate with many long DNS SANs gets a short denial: the first few, clipped,
    and how many more."""
    sans = [f"{'s' * 5000}-{i}.example" for i in range(2000)]
    message = AllowedClients(["cluster-autoscaler"]).decide(["mallory"], sans)
    assert message is not None
    assert len(message) < 4 * 1024
    assert "'mallory'" in message and "and 1997 more" in message
    assert "is not in tls.allowedClients" in message


def _handshake(port: int, context: ssl.SSLContext) -> tuple[str | None, bytes]:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.version(), tls.getpeercert(binary_form=True) or b""


def _served_serial(port: int, pki: PKI) -> int:
    _, der = _handshake(port, client_ssl_context(pki))
    return x509.load_der_x509_certificate(der).serial_number


def _tls11_client(pki: PKI) -> ssl.SSLContext:
    context = client_ssl_context(pki, maximum_version=ssl.TLSVersion.TLSv1_1)
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let our OpenSSL offer TLS 1.1 at all
    return context


def _serve_one_tls11_handshake(pki: PKI, listener: socket.socket) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    conn, _ = listener.accept()
    with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
        pass


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
async def test_tls_1_1_refused_tls_1_2_accepted(pki: PKI) -> None:
    # Control: this client really can speak TLS 1.1 (to a server that allows it).
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = asyncio.to_thread(_serve_one_tls11_handshake, pki, listener)
        port = listener.getsockname()[1]
        version, _ = (
            await asyncio.gather(asyncio.to_thread(_handshake, port, _tls11_client(pki)), peer)
        )[0]
    assert version == "TLSv1.1"
    tls12 = client_ssl_context(pki, maximum_version=ssl.TLSVersion.TLSv1_2)
    async with serving(make_config(pki)) as running:
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            await asyncio.to_thread(_handshake, running.port, _tls11_client(pki))
        version, _ = await asyncio.to_thread(_handshake, running.port, tls12)
    assert version == "TLSv1.2"


def _replace(target: Path, source: Path) -> None:
    # Like a Secret volume update: the new file appears under the old name in one step.
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(source.read_bytes())
    tmp.replace(target)


async def test_rotated_server_certificate_is_served_without_restart(pki: PKI) -> None:
    first = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    rotated = pki.server()
    async with serving(make_config(pki), reload_interval=0.0) as running:
        assert await asyncio.to_thread(_served_serial, running.port, pki) == first
        _replace(pki.server_key, rotated.key)
        _replace(pki.server_cert, rotated.cert)
        assert await asyncio.to_thread(_served_serial, running.port, pki) == (
            rotated.issued.cert.serial_number
        )
        # gRPC clients connecting now are served by the new certificate too.
        async with grpc_channel(pki, address(running)) as channel:
            assert len((await node_groups(channel)).nodeGroups) == 2
        assert running.cert_not_after() == rotated.issued.cert.not_valid_after_utc.timestamp()


@pytest.mark.parametrize(("interval", "checks"), [(3600.0, 0), (0.0, 4)])
async def test_new_connections_call_into_python_for_the_tls_files_once_per_interval(
    pki: PKI, monkeypatch: pytest.MonkeyPatch, interval: float, checks: int
) -> None:
    # Each accepted connection used to take the GIL to ask Python whether the files changed,
    # even when Python's own interval (which starts when the files were loaded) made the
    # answer "not checked".
    calls: list[None] = []
    check = RunningServer._check_tls_files

    def counted(self: RunningServer, *, force: bool = False) -> None:
        calls.append(None)
        check(self, force=force)

    monkeypatch.setattr(RunningServer, "_check_tls_files", counted)
    async with serving(make_config(pki), reload_interval=interval) as running:
        for _ in range(4):  # a new connection each
            async with grpc_channel(pki, address(running)) as channel:
                assert len((await node_groups(channel)).nodeGroups) == 2
    assert len(calls) == checks


async def test_the_transport_s_check_once_an_interval_is_not_undone_by_a_scrape(pki: PKI) -> None:
    # The transport paces its checks on its own clock; Python's interval, restarted by the
    # scrape below, used to answer its check with "not yet", and the rotated certificate then
    # waited up to another interval for the transport's next check.
    interval = 1.0
    first = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    rotated = pki.server()
    async with serving(make_config(pki), reload_interval=interval) as running:
        await asyncio.sleep(interval)
        # The transport's check is due by now (an interval after the start): this one makes
        # it, or an earlier connection did; either way the next is due an interval later.
        assert await asyncio.to_thread(_served_serial, running.port, pki) == first
        await asyncio.sleep(interval)
        running.cert_not_after()  # a metrics scrape: Python checks the files, unchanged
        _replace(pki.server_key, rotated.key)
        _replace(pki.server_cert, rotated.cert)
        # More than an interval after the transport's last check: this handshake checks.
        assert await asyncio.to_thread(_served_serial, running.port, pki) == (
            rotated.issued.cert.serial_number
        )


async def test_half_rotated_files_keep_the_previous_certificate(pki: PKI) -> None:
    first = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    rotated = pki.server()
    async with serving(make_config(pki), reload_interval=0.0) as running:
        _replace(pki.server_cert, rotated.cert)  # the key is still the old one: a mismatch
        assert await asyncio.to_thread(_served_serial, running.port, pki) == first
        _replace(pki.server_key, rotated.key)
        assert await asyncio.to_thread(_served_serial, running.port, pki) == (
            rotated.issued.cert.serial_number
        )


def _unusable_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "cloudscale_autoscaler.transport.tls" and "not usable" in r.getMessage()
    ]


async def test_a_deleted_certificate_file_is_logged_once(
    pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    first = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    rotated = pki.server()
    caplog.set_level(logging.WARNING, logger="cloudscale_autoscaler.transport.tls")
    async with serving(make_config(pki), reload_interval=0.0) as running:
        pki.server_cert.unlink()
        for _ in range(3):  # every handshake rechecks the files
            assert await asyncio.to_thread(_served_serial, running.port, pki) == first
        (warning,) = _unusable_warnings(caplog)
        assert str(pki.server_cert) in warning and "No such file" in warning
        _replace(pki.server_key, rotated.key)
        _replace(pki.server_cert, rotated.cert)
        assert await asyncio.to_thread(_served_serial, running.port, pki) == (
            rotated.issued.cert.serial_number
        )


async def test_an_expired_rotation_keeps_the_previous_certificate(
    pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    first = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    expired = pki.server(validity=Validity.expired())
    caplog.set_level(logging.WARNING, logger="cloudscale_autoscaler.transport.tls")
    async with serving(make_config(pki), reload_interval=0.0) as running:
        _replace(pki.server_key, expired.key)
        _replace(pki.server_cert, expired.cert)
        for _ in range(2):
            assert await asyncio.to_thread(_served_serial, running.port, pki) == first
        (warning,) = _unusable_warnings(caplog)
        assert "expired at" in warning


async def test_a_rotation_to_a_key_rustls_refuses_keeps_the_previous_certificate(
    pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    served = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    p521 = with_key(pki.server().issued, pki.ca, ec.generate_private_key(ec.SECP521R1()))
    caplog.set_level(logging.WARNING)
    async with serving(make_config(pki), reload_interval=0.0) as running:
        p521.write(pki.dir / "p521.crt", pki.dir / "p521.key")
        _replace(pki.server_key, pki.dir / "p521.key")
        _replace(pki.server_cert, pki.dir / "p521.crt")
        for _ in range(3):
            assert await asyncio.to_thread(_served_serial, running.port, pki) == (
                served.serial_number
            )
        # The metric reports the certificate still served, not the refused one.
        assert running.cert_not_after() == served.not_valid_after_utc.timestamp()
    (warning,) = _unusable_warnings(caplog)
    assert f"tls.key {pki.server_key}: unsupported key" in warning
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_rotated_client_ca_applies_to_new_connections(pki: PKI) -> None:
    new_ca = other_ca("rotated client CA")
    new_client = pki.client(ca=new_ca)
    async with serving(make_config(pki), reload_interval=0.0) as running:
        target = address(running)
        async with grpc_channel(pki, target, client=new_client) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as before:
                await node_groups(channel)
        assert before.value.code() == grpc.StatusCode.UNAVAILABLE
        # The bundle keeps the old CA too: our test clients also verify the server with it.
        pki.ca_cert.write_bytes(pki.ca.cert_pem() + new_ca.cert_pem())
        async with grpc_channel(pki, target, client=new_client) as channel:
            assert len((await node_groups(channel)).nodeGroups) == 2


def test_reload_checks_files_at_most_once_per_interval(pki: PKI) -> None:
    now = [1000.0]
    creds = ReloadingCredentials(
        pki.server_cert, pki.server_key, pki.ca_cert, min_interval=1.0, clock=lambda: now[0]
    )
    rotated = pki.server()
    _replace(pki.server_key, rotated.key)
    _replace(pki.server_cert, rotated.cert)
    now[0] += 0.5
    assert creds.refresh() is False  # too soon: files not even looked at
    assert creds.material.leaf.serial_number != rotated.issued.cert.serial_number
    now[0] += 0.6
    assert creds.refresh() is True
    assert creds.material.leaf.serial_number == rotated.issued.cert.serial_number
    now[0] += 5
    assert creds.refresh() is False  # unchanged files: nothing new


def test_reload_ignores_a_touch_without_content_change(pki: PKI) -> None:
    creds = ReloadingCredentials(pki.server_cert, pki.server_key, pki.ca_cert, min_interval=0)
    _replace(pki.server_cert, pki.server_cert)  # new inode, same bytes
    assert creds.refresh(force=True) is False


def test_a_fifo_rotated_in_is_refused_without_blocking(
    pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    creds = ReloadingCredentials(pki.server_cert, pki.server_key, pki.ca_cert, min_interval=0)
    served = creds.material
    pki.server_cert.unlink()
    os.mkfifo(pki.server_cert)
    caplog.set_level(logging.WARNING, logger="cloudscale_autoscaler.transport.tls")
    refresh = threading.Thread(target=creds.refresh, kwargs={"force": True}, daemon=True)
    refresh.start()
    refresh.join(10)
    if refresh.is_alive():  # a writer's open and close end the blocked read
        os.close(os.open(pki.server_cert, os.O_WRONLY | os.O_NONBLOCK))
        refresh.join(10)
        pytest.fail("reading the rotated FIFO blocked")
    assert creds.material is served
    assert _unusable_warnings(caplog) == [
        "TLS files changed but are not usable; keeping the previous: "
        f"tls.cert {pki.server_cert}: cannot read: not a regular file"
    ]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("broken", "expect"),
    [
        ("missing-cert", "tls.cert"),
        ("garbage-cert", "tls.cert"),
        ("garbage-key", "tls.key"),
        ("encrypted-key", "tls.key"),
        ("mismatched-key", "does not match"),
        ("empty-ca", "tls.clientCA"),
    ],
)
def test_bad_tls_files_are_named(pki: PKI, broken: str, expect: str) -> None:
    cert, key, ca = pki.server_cert, pki.server_key, pki.ca_cert
    bad: Path
    if broken == "missing-cert":
        cert = bad = pki.dir / "absent.crt"
    elif broken == "garbage-cert":
        cert = bad = _write(pki.dir / "garbage.crt", b"not a certificate")
    elif broken == "garbage-key":
        key = bad = _write(pki.dir / "garbage.key", b"-----BEGIN PRIVATE KEY-----\nxx\n")
    elif broken == "encrypted-key":
        from cryptography.hazmat.primitives import serialization

        encrypted = pki.ca.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
        key = bad = _write(pki.dir / "encrypted.key", encrypted)
    elif broken == "mismatched-key":
        key = bad = pki.client_key
    else:
        ca = bad = _write(pki.dir / "empty-ca.crt", b"")
    with pytest.raises(TLSFileError) as error:
        load_material(cert, key, ca)
    assert str(bad) in str(error.value)
    assert expect in str(error.value)


NO_SAN = (
    "has no DNS or IP subject alternative name, so the Cluster Autoscaler refuses it "
    '("x509: certificate relies on legacy Common Name field"): it checks the host of '
    "`address` in its cloud-config against these names; add that host as a SAN"
)
NO_CA = (
    "holds no CA certificate (basicConstraints CA:TRUE), so no client certificate can be "
    "verified against it and every client would be refused; give the CA that signs the "
    "Cluster Autoscaler's client certificate"
)


def _server_named(pki: PKI, *, dns: list[str], ips: list[str], uri: bool = False) -> CertFiles:
    """A server certificate of this PKI's CA with exactly these names."""
    issued = mint_leaf(
        pki.ca, "localhost", dns=dns, ips=ips, usages=[ExtendedKeyUsageOID.SERVER_AUTH]
    )
    if uri:  # a SAN extension that names no host: a SPIFFE-style identity only
        names = x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://c/s")])
        builder = (
            x509.CertificateBuilder()
            .subject_name(issued.cert.subject)
            .issuer_name(pki.ca.cert.subject)
            .public_key(issued.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(issued.cert.not_valid_before_utc)
            .not_valid_after(issued.cert.not_valid_after_utc)
            .add_extension(names, critical=False)
        )
        issued = Issued(builder.sign(pki.ca.key, hashes.SHA256()), issued.key)
    files = CertFiles(pki.dir / "named.crt", pki.dir / "named.key", issued)
    issued.write(files.cert, files.key)
    return files


@pytest.mark.parametrize(
    ("dns", "ips", "uri", "refused"),
    [
        ([], [], False, True),
        ([], [], True, True),
        (["provider.kube-system.svc"], [], False, False),
        ([], ["10.0.0.7"], False, False),
    ],
    ids=["no-san", "uri-only", "dns", "ip"],
)
def test_a_server_certificate_needs_a_dns_or_ip_name(
    pki: PKI, dns: list[str], ips: list[str], uri: bool, refused: bool
) -> None:
    named = _server_named(pki, dns=dns, ips=ips, uri=uri)
    if not refused:
        assert load_material(named.cert, named.key, pki.ca_cert).leaf == named.issued.cert
        return
    with pytest.raises(TLSFileError) as error:
        load_material(named.cert, named.key, pki.ca_cert)
    assert str(error.value) == f"tls.cert {named.cert}: {NO_SAN}"


@pytest.mark.parametrize(
    ("bundle", "refused"),
    [("leaf", True), ("two-leaves", True), ("leaf-then-ca", False), ("ca", False)],
)
def test_a_client_ca_bundle_needs_a_ca_certificate(pki: PKI, bundle: str, refused: bool) -> None:
    leaf, ca = pki.client_cert.read_bytes(), pki.ca.cert_pem()
    content = {
        "leaf": leaf,
        "two-leaves": leaf + pki.server_cert.read_bytes(),
        "leaf-then-ca": leaf + ca,
        "ca": ca,
    }[bundle]
    client_ca = _write(pki.dir / "bundle.crt", content)
    if not refused:
        assert load_material(pki.server_cert, pki.server_key, client_ca).client_ca == content
        return
    with pytest.raises(TLSFileError) as error:
        load_material(pki.server_cert, pki.server_key, client_ca)
    assert str(error.value) == f"tls.clientCA {client_ca}: {NO_CA}"


@pytest.mark.parametrize("rotation", ["server-without-san", "leaf-as-client-ca"])
def test_a_rotation_clients_would_refuse_keeps_the_previous_files(
    pki: PKI, caplog: pytest.LogCaptureFixture, rotation: str
) -> None:
    creds = ReloadingCredentials(pki.server_cert, pki.server_key, pki.ca_cert, min_interval=0)
    served = creds.material
    caplog.set_level(logging.WARNING, logger="cloudscale_autoscaler.transport.tls")
    if rotation == "server-without-san":
        named = _server_named(pki, dns=[], ips=[])
        _replace(pki.server_key, named.key)
        _replace(pki.server_cert, named.cert)
        reason = f"tls.cert {pki.server_cert}: {NO_SAN}"
    else:
        _replace(pki.ca_cert, pki.client_cert)
        reason = f"tls.clientCA {pki.ca_cert}: {NO_CA}"
    assert creds.refresh(force=True) is False
    assert creds.material is served
    assert _unusable_warnings(caplog) == [
        f"TLS files changed but are not usable; keeping the previous: {reason}"
    ]
