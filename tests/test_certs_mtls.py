"""Acceptance: the `certs` command's files work for the real mTLS server, and only as intended.

Each test runs `cloudscale-autoscaler certs` as a subprocess (the CLI an operator uses) and
serves its files with the real transport server in-process (fixtures/tls.serving): the dev
client certificate gets in, the client certificate cannot pose as a server (its extended key
usage is clientAuth only), and `--ip` / `--dns` add server names clients verify.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from fixtures.tls import serving
from fixtures.tools import run_cli

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc
from cloudscale_autoscaler.settings.types import Config, NodeGroupConfig, TLSConfig
from cloudscale_autoscaler.transport.tls import TLSFileError

TIMEOUT = 10.0
GROUPS = (
    NodeGroupConfig(name="workers", min_size=1, max_size=7, flavor="flex-4-2", image="x"),
    NodeGroupConfig(name="gpu", min_size=0, max_size=3, flavor="flex-8-4", image="x"),
)
# Any 127/8 address is loopback on Linux; the default server certificate does not name this one.
OTHER_LOOPBACK = "127.0.0.2"
EXTRA_DNS = "autoscaler.example"


def certs_command(out: Path, *extra: str) -> Path:
    done = run_cli("certs", "--out", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return out


def config(
    certs: Path,
    *,
    identity: str = "server",
    host: str = "127.0.0.1",
    allowed_clients: tuple[str, ...] = (),
) -> Config:
    """Serve `identity`.crt/.key from the certs output, trusting its ca.crt for clients."""
    return Config(
        cluster="test",
        node_groups=GROUPS,
        listen=f"{host}:0",
        tls=TLSConfig(
            cert=certs / f"{identity}.crt",
            key=certs / f"{identity}.key",
            client_ca=certs / "ca.crt",
            allowed_clients=allowed_clients,
        ),
    )


def dev_client_channel(
    certs: Path, address: str, *, server_name: str | None = None
) -> grpc.aio.Channel:
    """The dev client certificate, verifying the server against the certs output's ca.crt."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.crt").read_bytes(),
        private_key=(certs / "client.key").read_bytes(),
        certificate_chain=(certs / "client.crt").read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.aio.secure_channel(address, credentials, options=options)


async def node_groups(channel: grpc.aio.Channel) -> list[tuple[str, int, int]]:
    stub = pb_grpc.CloudProviderStub(channel)  # type: ignore[no-untyped-call]
    answer = await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=TIMEOUT)
    return [(g.id, g.minSize, g.maxSize) for g in answer.nodeGroups]


async def refused(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await node_groups(channel)
    return caught.value


async def test_dev_client_certificate_calls_the_server(tmp_path: Path) -> None:
    certs = certs_command(tmp_path / "certs")
    # allowedClients as the deploy examples set it: the dev client's name must match it.
    served = config(certs, allowed_clients=("cluster-autoscaler",))
    async with (
        serving(served) as running,
        dev_client_channel(certs, f"127.0.0.1:{running.port}") as channel,
    ):
        groups = await node_groups(channel)
    assert groups == [("workers", 1, 7), ("gpu", 0, 3)]


async def test_client_certificate_is_refused_as_server_certificate(tmp_path: Path) -> None:
    certs = certs_command(tmp_path / "certs")
    # Same CA, a valid chain, but the extended key usage says clientAuth only: clients would
    # refuse it in the handshake (BoringSSL: "unsupported certificate purpose"), so the server
    # refuses it before it listens, naming the file.
    with pytest.raises(TLSFileError) as refused_at_start:
        async with serving(config(certs, identity="client")):
            pass
    message = str(refused_at_start.value)
    assert str(certs / "client.crt") in message and "lacks serverAuth" in message


@pytest.mark.parametrize(
    ("extra", "host", "server_name", "accepted"),
    [
        pytest.param(["--ip", OTHER_LOOPBACK], OTHER_LOOPBACK, None, True, id="ip-san"),
        pytest.param([], OTHER_LOOPBACK, None, False, id="ip-not-in-cert"),
        pytest.param(["--dns", EXTRA_DNS], "127.0.0.1", EXTRA_DNS, True, id="dns-san"),
        pytest.param([], "127.0.0.1", EXTRA_DNS, False, id="dns-not-in-cert"),
    ],
)
async def test_extra_server_names_are_verified(
    tmp_path: Path, extra: list[str], host: str, server_name: str | None, accepted: bool
) -> None:
    certs = certs_command(tmp_path / "certs", *extra)
    async with serving(config(certs, host=host)) as running:
        address = f"{host}:{running.port}"
        async with dev_client_channel(certs, address, server_name=server_name) as channel:
            if accepted:
                assert await node_groups(channel) == [("workers", 1, 7), ("gpu", 0, 3)]
                return
            error = await refused(channel)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "hostname verification" in (error.details() or "").lower(), error.details()
