"""One real-CA run: the tools, the emulator, a loopback kube-apiserver, every measurement."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.plan import RealCaPlan
from bench.procs import Processes
from bench.realca import testbed
from bench.realca.autoscaler import flags
from bench.realca.measure import RealCaBench, run_sizes
from bench.report import machine, run_record
from bench.stack import make_certs, start_emulator

log = logging.getLogger("bench")


def run_real_ca(plan: RealCaPlan, out: Path, command: str) -> dict[str, Any]:
    """Every generation of `plan` at every size; `command` is how the run was asked for."""
    started = time.time()
    description = machine()  # before the run: its load average is the one at the start
    log.info(
        "etcd, kube-apiserver, CA %s: locating (or building) them", ", ".join(plan.generations)
    )
    testbed.ensure_etcd()
    testbed.ensure_apiserver()
    binaries = {version: testbed.ensure_autoscaler(version) for version in plan.generations}
    workdir = out / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Processes(out / "logs")
    try:
        pki = make_certs(workdir / "pki")
        emulator, admin = start_emulator(procs)
        with (
            tempfile.TemporaryDirectory(prefix="kube-", dir=workdir) as kube_dir,
            testbed.running_kube(Path(kube_dir)) as kube,
        ):
            rows = run_sizes(
                RealCaBench(plan, procs, pki, emulator, admin, kube, binaries, workdir)
            )
    finally:
        procs.stop_all()
    return {
        **run_record(description, command, started),
        "plan": asdict(plan),
        "ca_flags": flags(plan.scan_interval_s),
        "results": rows,
    }
