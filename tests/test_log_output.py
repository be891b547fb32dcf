"""What `serve --log-format json --log-level debug` writes to stderr, as a real process: only
JSON lines (a refused TLS handshake, a port already in use, an exception in a transport
callback included), our debug lines, and no third-party debug or info noise."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import grpc
import pytest
from fixtures.emulator import TOKEN, RunningEmulator
from fixtures.tls import PKI, grpc_channel
from fixtures.tools import cli, free_port

from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc

START_SECONDS = 60.0


def write_config(directory: Path, pki: PKI, port: int) -> Path:
    token = directory / "token"
    token.write_text("log-output-test-token-0123456789\n")
    token.chmod(0o600)
    config = directory / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "cluster": "logs",
                "listen": f"127.0.0.1:{port}",
                "tls": {
                    "cert": str(pki.server_cert),
                    "key": str(pki.server_key),
                    "clientCA": str(pki.ca_cert),
                },
                # Nothing listens there: serving starts anyway, with warnings.
                "cloudscale": {"url": f"http://127.0.0.1:{free_port()}/v1", "tokenFile": "token"},
                "nodeGroups": [
                    {"name": "w", "minSize": 0, "maxSize": 2, "flavor": "flex-4-2", "image": "d"}
                ],
            }
        )
    )
    return config


def clean_env() -> dict[str, str]:
    """The environment an operator's pod has: no gRPC logging settings of ours."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}


@contextmanager
def serving(
    config: Path, stderr: Path, log_format: str = "json"
) -> Iterator[subprocess.Popen[bytes]]:
    argv = cli("--log-format", log_format, "--log-level", "debug", "serve", "--config", str(config))
    with open(stderr, "wb") as sink:
        process = subprocess.Popen(argv, stderr=sink, stdout=subprocess.DEVNULL, env=clean_env())
    try:
        deadline = time.monotonic() + START_SECONDS
        while "gRPC server listening" not in stderr.read_text(errors="replace"):
            assert process.poll() is None, stderr.read_text(errors="replace")
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.05)
        yield process
    finally:
        with suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        process.wait(30)


def refused_handshakes(port: int, pki: PKI) -> None:
    """A TLS client without a certificate and a plaintext HTTP/1 client."""
    no_cert = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    no_cert.load_verify_locations(cafile=str(pki.ca_cert))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        suppress(ssl.SSLError, OSError),
        no_cert.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(b"PRI * HTTP/2.0\r\n\r\n")
        tls.recv(100)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with suppress(OSError):
            raw.recv(100)


def json_lines(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line on stderr: {line!r}\n--- all of stderr:\n{text}")
    return records


async def test_json_logs_are_json_only_with_our_debug_lines(tmp_path: Path, pki: PKI) -> None:
    port = free_port()
    config = write_config(tmp_path, pki, port)
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    with serving(config, first):
        async with grpc_channel(pki, f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            groups = await stub.NodeGroups(pb.NodeGroupsRequest())
            assert [g.id for g in groups.nodeGroups] == ["w"]
        async with grpc_channel(pki, f"127.0.0.1:{port}", with_client_cert=False) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await pb_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest())
        await asyncio.to_thread(refused_handshakes, port, pki)
        # A second instance on the same port: it cannot listen, and says so in JSON.
        argv = ["--log-format", "json", "--log-level", "debug", "serve", "--config", str(config)]
        done = await asyncio.to_thread(
            subprocess.run,
            cli(*argv),
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
            check=False,
        )
        second.write_text(done.stderr)
        assert done.returncode == 1
    records = json_lines(first.read_text()) + json_lines(second.read_text())
    assert any(r["message"].startswith("cannot start: listen") for r in records)
    # Our debug lines are there: one per RPC.
    rpc_lines = [r for r in records if r.get("method", "").endswith("/NodeGroups")]
    assert any(r["level"] == "debug" for r in rpc_lines)
    noisy = [r for r in records if r["level"] in ("debug", "info")]
    assert all(r["logger"].startswith("cloudscale_autoscaler") for r in noisy), noisy


@pytest.mark.parametrize("log_format", ["plain", "json"])
async def test_a_refused_handshake_is_logged_with_the_peer_and_why(
    tmp_path: Path, pki: PKI, log_format: str
) -> None:
    port = free_port()
    config = write_config(tmp_path, pki, port)
    output = tmp_path / f"{log_format}.log"
    with serving(config, output, log_format=log_format):
        await asyncio.to_thread(refused_handshakes, port, pki)
        deadline = time.monotonic() + START_SECONDS
        while "TLS handshake refused" not in output.read_text():
            assert time.monotonic() < deadline, output.read_text()
            await asyncio.sleep(0.05)
    text = output.read_text()
    if log_format == "json":
        (refused,) = [r for r in json_lines(text) if r["message"] == "TLS handshake refused"]
        assert refused["level"] == "warning"
        assert refused["peer"].startswith("127.0.0.1:")
        # Both clients came from 127.0.0.1: the second is counted, not logged, this minute.
        assert "certificate" in refused["reason"].lower()
    else:
        (line,) = [line for line in text.splitlines() if "TLS handshake refused" in line]
        assert re.search(r" WARNING \S+: TLS handshake refused peer=127\.0\.0\.1:\d+ ", line)
        assert "reason=" in line and "certificate" in line.lower()


def test_unraisable_exceptions_are_logged_in_the_chosen_format(tmp_path: Path) -> None:
    # What the transport's callbacks raise reaches sys.unraisablehook (pyo3's
    # write_unraisable), as does an exception in __del__: the same hook, a real process.
    program = (
        "from cloudscale_autoscaler.observability.logs import setup_logging\n"
        "setup_logging('json', 'info')\n"
        "class Doomed:\n"
        "    def __del__(self):\n"
        "        raise RuntimeError('raised where no caller can see it')\n"
        "Doomed()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    (record,) = json_lines(done.stderr)
    assert record["level"] == "error"
    assert record["logger"] == "cloudscale_autoscaler.unraisable"
    assert "Doomed.__del__" in record["message"]
    assert "RuntimeError: raised where no caller can see it" in record["exception"]


def run_cli(
    log_format: str, log_level: str, *args: str, token: str = "x" * 20
) -> subprocess.CompletedProcess[str]:
    argv = cli("--log-format", log_format, "--log-level", log_level, *args)
    env = {**clean_env(), "CLOUDSCALE_API_TOKEN": token}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)


def run_json(*args: str, token: str = "x" * 20) -> subprocess.CompletedProcess[str]:
    return run_cli("json", "debug", *args, token=token)


@pytest.mark.parametrize("case", ["invalid", "missing"])
def test_a_config_serve_refuses_is_one_json_record_listing_the_errors(
    tmp_path: Path, case: str
) -> None:
    config = tmp_path / "config.yaml"
    if case == "invalid":
        config.write_text("cluster: Not_A_Label\ntls: {insecure: true}\nnodeGroups: []\n")
    done = run_json("serve", "--config", str(config))
    assert done.returncode == 2
    (record,) = json_lines(done.stderr)
    assert record["level"] == "error"
    count = 1 if case == "missing" else len(record["errors"])
    noun = "error" if count == 1 else "errors"
    assert record["message"] == f"{config}: invalid config ({count} {noun})"
    expected = "cluster: " if case == "invalid" else f"{config}: cannot read: "
    assert record["errors"][0].startswith(expected)


def write_warned_config(directory: Path, url: str) -> Path:
    """A valid config that check-config warns about (autoscalingOptions), for `url`."""
    config = directory / "config.yaml"
    group = {"name": "w", "minSize": 0, "maxSize": 2, "flavor": "flex-4-2", "image": "debian-12"}
    doc = {
        "cluster": "logs",
        "tls": {"insecure": True},
        "cloudscale": {"url": url},
        "stateDir": str(directory / "state"),
        "nodeGroups": [{**group, "autoscalingOptions": {"scaleDownUnneededTime": "5m"}}],
    }
    config.write_text(json.dumps(doc))
    return config


def test_check_config_and_template_write_only_json_to_stderr(tmp_path: Path) -> None:
    # Nothing listens at the URL: template falls back to the flavor slug, with a note.
    config = write_warned_config(tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    checked = run_json("check-config", "--config", str(config))
    assert checked.returncode == 0, checked.stderr
    assert "config OK" in checked.stdout
    (warning,) = json_lines(checked.stderr)
    assert warning["level"] == "warning" and "autoscalingOptions" in warning["message"]
    shown = run_json("template", "--config", str(config), "w")
    assert shown.returncode == 0, shown.stderr
    records = json_lines(shown.stderr)
    assert any("sizes read from the flavor slug" in r["message"] for r in records)


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_a_commands_own_output_shows_whatever_the_log_level(
    tmp_path: Path, log_format: str
) -> None:
    """check-config's warning at --log-level error and template's notes (info) at warning: the
    operator's output, in both formats alike, JSON still one record per line."""
    config = write_warned_config(tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    checked = run_cli(log_format, "error", "check-config", "--config", str(config))
    assert checked.returncode == 0, checked.stderr
    shown = run_cli(log_format, "warning", "template", "--config", str(config), "w")
    assert shown.returncode == 0, shown.stderr
    if log_format == "json":
        (warning,) = json_lines(checked.stderr)
        assert warning["level"] == "warning"
        messages = [r["message"] for r in json_lines(shown.stderr)]
    else:
        (warning_line,) = checked.stderr.splitlines()
        warning = {"message": warning_line.removeprefix("warning: ")}
        messages = [shown.stderr]
    assert "autoscalingOptions" in warning["message"]
    assert any("# node group w: interfaces: " in m and "# price: " in m for m in messages)


async def test_debug_logs_each_api_request_once_and_no_library_lines(
    tmp_path: Path, emulator: RunningEmulator
) -> None:
    config = write_warned_config(tmp_path, emulator.url)
    argv = ("check-config", "--online", "--config", str(config))
    checked = await asyncio.to_thread(run_json, *argv, token=TOKEN)
    assert checked.returncode == 0, checked.stderr
    records = json_lines(checked.stderr)
    requests = [r for r in records if r["message"].startswith("cloudscale API GET ")]
    assert {r["operation"] for r in requests} >= {"list_flavors", "list_images", "list_regions"}
    assert all(r["logger"].startswith("cloudscale_autoscaler") for r in records), records
