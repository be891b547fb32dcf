"""Runs the Go load client (bench/go/cmd/benchclient) against one server under test and
measures what the server processes spent meanwhile."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import Proc
from bench.stack import Endpoint, Pki

# Bounds every client run, whatever its own -max-seconds says.
CLIENT_TIMEOUT = 900.0


class ClientError(RuntimeError):
    pass


@dataclass(frozen=True)
class Measured:
    result: dict[str, Any]
    wall_seconds: float
    # CPU seconds each watched process used while the client ran, by process name.
    cpu: dict[str, float]


@dataclass(frozen=True)
class GoClient:
    binary: Path
    pki: Pki

    def run(self, mode: str, endpoint: Endpoint, args: list[str], max_seconds: float) -> Any:
        command = [
            str(self.binary),
            mode,
            "-addr",
            endpoint.address,
            "-cert",
            str(self.pki.client_cert),
            "-key",
            str(self.pki.client_key),
            "-ca",
            str(self.pki.ca),
            "-max-seconds",
            str(max_seconds),
            *args,
        ]
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=min(CLIENT_TIMEOUT, max_seconds + 120),
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise ClientError(f"benchclient {mode} did not finish: {error}") from error
        if done.returncode != 0:
            raise ClientError(
                f"benchclient {mode} against {endpoint.proc.name} failed ({done.returncode}):\n"
                f"{done.stderr}\n--- {endpoint.proc.name} log ---\n{endpoint.proc.log_tail()}"
            )
        return json.loads(done.stdout)

    def measure(
        self, mode: str, endpoint: Endpoint, args: list[str], max_seconds: float, watch: list[Proc]
    ) -> Measured:
        before = {proc.name: proc.cpu() for proc in watch}
        started = time.perf_counter()
        result = self.run(mode, endpoint, args, max_seconds)
        wall = time.perf_counter() - started
        cpu = {proc.name: proc.cpu() - before[proc.name] for proc in watch}
        return Measured(result, wall, cpu)
