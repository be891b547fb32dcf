"""`cloudscale-autoscaler serve` as a real subprocess: config file, start, output capture, stop.

Used where only a real process shows the behaviour: what reaches stdout/stderr (secrets),
and what a SIGTERM leaves behind (graceful shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from fixtures.tls import PKI
from fixtures.tools import cli, free_port

_GRPC_PORT = re.compile(r"gRPC server listening.* port=(\d+)")
_METRICS_PORT = re.compile(r"metrics and health endpoint on http://[^:]+:(\d+)")
START_LIMIT_SECONDS = 60.0


def _dying_with_parent(argv: list[str]) -> list[str]:
    """`argv` run by setpriv, which asks for SIGKILL when the test process ends and then execs
    it (same PID): a test that fails before its own kill leaves no `serve` behind to hold
    ports and the emulator. Not a preexec_fn: Python code run between fork and exec in a
    process with gRPC's threads made the child die before exec now and then."""
    setpriv = shutil.which("setpriv")  # util-linux
    return argv if setpriv is None else [setpriv, "--pdeathsig", "KILL", "--", *argv]


def write_config(
    directory: Path,
    pki: PKI,
    api_url: str,
    token: str,
    *,
    cluster: str = "sec",
    groups: list[dict[str, Any]] | None = None,
    token_mode: int = 0o600,
    cloudscale: dict[str, Any] | None = None,
    **top: Any,
) -> Path:
    """A serve config in `directory` with the token in a file of mode `token_mode`; `top`
    adds top-level keys (camelCase, as in the YAML), `cloudscale` keys of that section."""
    directory.mkdir(parents=True, exist_ok=True)
    token_file = directory / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(token_mode)
    default_group = {
        "name": "workers",
        "minSize": 0,
        "maxSize": 3,
        "flavor": "flex-4-2",
        "image": "debian-12",
        "zone": "lpg1",
    }
    document = {
        "cluster": cluster,
        "listen": f"127.0.0.1:{free_port()}",  # the loader refuses port 0
        "tls": {
            "cert": str(pki.server_cert),
            "key": str(pki.server_key),
            "clientCA": str(pki.ca_cert),
        },
        "cloudscale": {"url": api_url, "tokenFile": str(token_file), **(cloudscale or {})},
        "nodeGroups": groups or [default_group],
        **top,
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@dataclass
class ServeProcess:
    process: asyncio.subprocess.Process
    port: int
    metrics_port: int | None
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    _drains: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    async def stop(self, sig: int | None = signal.SIGTERM, limit: float = 60.0) -> int:
        """Send `sig` (None: none, the caller did), wait for the exit, collect the rest of
        the output; the exit code."""
        if sig is not None and self.process.returncode is None:
            self.process.send_signal(sig)
        code = await asyncio.wait_for(self.process.wait(), limit)
        await asyncio.gather(*self._drains)
        return code

    async def wait_for_output(self, text: str, limit: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while text not in self.output:
            if loop.time() > deadline or self.process.returncode is not None:
                raise AssertionError(f"{text!r} never appeared:\n{self.output}")
            await asyncio.sleep(0.02)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        for drain in self._drains:
            drain.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)


async def _drain(stream: asyncio.StreamReader, into: list[str]) -> None:
    while line := await stream.readline():
        into.append(line.decode(errors="replace"))


async def _wait_for_ports(
    stderr: asyncio.StreamReader, seen: list[str], want_metrics: bool
) -> tuple[int, int | None]:
    port = metrics = None
    while line := await stderr.readline():
        text = line.decode(errors="replace")
        seen.append(text)
        if match := _GRPC_PORT.search(text):
            port = int(match.group(1))
        if match := _METRICS_PORT.search(text):
            metrics = int(match.group(1))
        if port is not None and (metrics is not None or not want_metrics):
            return port, metrics
    raise AssertionError("serve exited before listening:\n" + "".join(seen))


async def start_serve(
    config: Path,
    *,
    log_level: str = "debug",
    metrics: bool = False,
    env: dict[str, str] | None = None,
) -> ServeProcess:
    """Start `cloudscale-autoscaler --log-level <level> serve --config <config>` (the installed
    entry point) and wait until it listens (gRPC, and the metrics endpoint if `metrics`)."""
    environment = {k: v for k, v in os.environ.items() if k != "CLOUDSCALE_API_TOKEN"}
    environment.update(env or {})
    argv = _dying_with_parent(cli("--log-level", log_level, "serve", "--config", str(config)))
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environment,
    )
    assert process.stdout is not None and process.stderr is not None
    stderr: list[str] = []
    try:
        port, metrics_port = await asyncio.wait_for(
            _wait_for_ports(process.stderr, stderr, metrics), START_LIMIT_SECONDS
        )
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    running = ServeProcess(process, port, metrics_port, stderr=stderr)
    running._drains = [
        asyncio.ensure_future(_drain(process.stdout, running.stdout)),
        asyncio.ensure_future(_drain(process.stderr, running.stderr)),
    ]
    return running
