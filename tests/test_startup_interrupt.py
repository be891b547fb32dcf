"""The config file is read like the files it names (a FIFO is refused, not waited on), and
Ctrl-C at a blocking point of start-up (an exec credential plugin that takes its time) ends
`check-config` and `serve` without a traceback. Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from fixtures.tls import PKI
from fixtures.tools import cli, free_port

# Generous: the processes answer at once when the code is right; only a hang reaches it.
WAIT_SECONDS = 30.0


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli(*args), capture_output=True, text=True, timeout=WAIT_SECONDS, check=False
    )


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_fifo_as_the_config_is_refused_naming_it(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    done = run_cli(command, "--config", str(fifo))
    assert done.returncode == 2, done.stderr
    assert f"{fifo}: cannot read: not a regular file" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_directory_as_the_config_is_named_so(tmp_path: Path) -> None:
    done = run_cli("check-config", "--config", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path}: cannot read: Is a directory" in done.stderr


def slow_kubeconfig(directory: Path, started: Path) -> Path:
    """A kubeconfig whose exec credential plugin says it started, then takes a minute."""
    kubeconfig = directory / "kubeconfig"
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "/bin/sh",
        "args": ["-c", f"touch {started}; exec sleep 60"],
    }
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"exec": plugin}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return kubeconfig


def write_config(
    directory: Path, pki: PKI, started: Path | None, api_url: str | None = None
) -> Path:
    token = directory / "token"
    token.write_text("interrupt-test-token-0123456789\n")
    token.chmod(0o600)
    config = directory / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "cluster": "interrupt",
                "listen": f"127.0.0.1:{free_port()}",
                "tls": {
                    "cert": str(pki.server_cert),
                    "key": str(pki.server_key),
                    "clientCA": str(pki.ca_cert),
                },
                "cloudscale": {
                    "url": api_url or f"http://127.0.0.1:{free_port()}/v1",
                    "tokenFile": "token",
                    "timeoutSeconds": 60,
                },
                "nodeGroups": [
                    {"name": "w", "minSize": 0, "maxSize": 2, "flavor": "flex-4-2", "image": "d"}
                ],
            }
            | ({} if started is None else {"kubernetes": kubernetes(directory, started)})
        )
    )
    return config


def kubernetes(directory: Path, started: Path) -> dict[str, str]:
    return {"kubeconfig": str(slow_kubeconfig(directory, started))}


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def started_process(argv: list[str], started: Path) -> Iterator[subprocess.Popen[str]]:
    """The process, once its credential plugin runs; its whole group (the sleeping plugin
    too) is killed afterwards."""
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # As from a terminal: a run started in the background (`cmd &` in a script) inherits
        # an ignored SIGINT, which the process would rightly go on ignoring.
        preexec_fn=_sigint_as_in_a_terminal,
    )
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not started.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the credential plugin never ran"
            time.sleep(0.05)
        yield process
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_ctrl_c_while_a_credential_plugin_runs_exits_without_a_traceback(
    tmp_path: Path, pki: PKI, command: str
) -> None:
    started = tmp_path / "plugin-started"
    config = write_config(tmp_path, pki, started)
    with started_process(cli(command, "--config", str(config)), started) as process:
        process.send_signal(signal.SIGINT)  # to the process only, as the plugin outlives it
        try:
            _, stderr = process.communicate(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command} still running {WAIT_SECONDS:.0f} s after SIGINT")
    assert "Traceback" not in stderr, stderr
    assert process.returncode in (1, 130), stderr


def test_ctrl_c_while_the_api_keeps_the_first_listing_waiting_abandons_start_up(
    tmp_path: Path, pki: PKI
) -> None:
    # An API that accepts connections and never answers: the initial inventory load waits.
    with socket.create_server(("127.0.0.1", 0)) as api:
        api.settimeout(WAIT_SECONDS)
        url = f"http://127.0.0.1:{api.getsockname()[1]}/v1"
        config = write_config(tmp_path, pki, None, api_url=url)
        process = subprocess.Popen(
            cli("serve", "--config", str(config)), stderr=subprocess.PIPE, text=True
        )
        try:
            waiting, _ = api.accept()  # serve is now inside its start-up
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=WAIT_SECONDS)
            waiting.close()
        finally:
            with suppress(ProcessLookupError):
                process.kill()
            process.communicate()
    assert "Traceback" not in stderr, stderr
    assert "stopped before start-up completed" in stderr
    assert "gRPC server listening" not in stderr
    assert process.returncode == 1, stderr
