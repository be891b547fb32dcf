"""Child processes of a benchmark run and what /proc says about them.

Each server under test runs in its own process so that its CPU time (utime + stime of all its
threads, /proc/<pid>/stat) and memory (VmRSS, VmHWM in /proc/<pid>/status) are its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


class ProcessError(RuntimeError):
    pass


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the benchmark never listens anywhere else)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cli(*args: str) -> list[str]:
    """The `cloudscale-autoscaler` command line, run by this interpreter (so, the venv's)."""
    return [sys.executable, "-m", "cloudscale_autoscaler", *args]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process (all its threads) has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may contain spaces; everything after its ")" is fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS


def memory_bytes(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (peak resident) in bytes."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024  # reported in kB
    return values


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu(self) -> float:
        self.check_alive()
        return cpu_seconds(self.pid)

    def memory(self) -> dict[str, int]:
        self.check_alive()
        return memory_bytes(self.pid)

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise ProcessError(
                f"{self.name} exited with {self.popen.returncode}; log tail:\n{self.log_tail()}"
            )

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def wait_for_port(self, port: int, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)
        raise ProcessError(f"{self.name} did not listen on 127.0.0.1:{port} within {timeout}s")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@dataclass
class Processes:
    """Every process a run started; `stop_all` ends them (also on errors)."""

    logdir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, args: list[str], cwd: Path | None = None) -> Proc:
        self.logdir.mkdir(parents=True, exist_ok=True)
        log = self.logdir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        proc.stop()
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()
