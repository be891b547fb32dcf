"""`cloudscale-autoscaler certs --out DIR`: write a development CA, server and client
certificate (certs.py mints them) and say what each file is for."""

from __future__ import annotations

import sys
from pathlib import Path

from cloudscale_autoscaler.transport.certs import (
    DEFAULT_CLIENT_NAME,
    CertError,
    mint_dev_pki,
    server_sans,
)


def certs_command(out: Path, dns: list[str], ip: list[str]) -> int:
    try:  # the names are checked while the server certificate is built
        pki = mint_dev_pki(dns, ip)
    except CertError as exc:
        print(f"certs: {exc}", file=sys.stderr)
        return 2
    written = [
        (out / "ca.crt", None, "CA certificate (server: tls.clientCA; Cluster Autoscaler: cacert)"),
        (out / "server.crt", out / "server.key", "server certificate and key (tls.cert, tls.key)"),
        (out / "client.crt", out / "client.key", "client certificate and key (CA: cert, key)"),
    ]
    pki.ca.write(out / "ca.crt")
    pki.server.write(out / "server.crt", out / "server.key")
    pki.client.write(out / "client.crt", out / "client.key")
    for cert_path, key_path, what in written:
        files = f"{cert_path}" + (f", {key_path}" if key_path else "")
        print(f"wrote {files}: {what}")
    dns_names, ip_names = server_sans(dns, ip)
    sans = ", ".join([*dns_names, *ip_names])
    until = pki.server.cert.not_valid_after_utc.isoformat()
    print(f"server names: {sans}; client name: {DEFAULT_CLIENT_NAME}; valid until {until}")
    print("the CA key was not kept: run `certs` again to add names or renew (development only)")
    return 0
