"""The real Cluster Autoscaler against N idle nodes: for each CA generation and N, what one
loop costs CA, our server and the emulator, and what CA's first loop after its start costs.

Loops are counted by CA's own histogram `cluster_autoscaler_function_duration_seconds`
(function="main": one observation per RunOnce). At the end of every loop (seen within a
fifth of the scan interval CA then waits, at most 2 s) the run takes a snapshot: CA's and our
server's metrics and the CPU time of CA, our server and the emulator. What happened in a
loop is the difference between two snapshots: it includes the scan interval's idle wait
after the loop, and whatever CA and our server do in the background meanwhile.
"""

from __future__ import annotations

import logging
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.plan import RealCaPlan
from bench.procs import Proc, Processes
from bench.promtext import Scrape, scrape
from bench.realca import nodes as kubenodes
from bench.realca.autoscaler import Autoscaler, start_autoscaler
from bench.realca.testbed import Kube
from bench.stack import (
    EmulatorAdmin,
    Endpoint,
    Layout,
    Pki,
    Population,
    ServerSettings,
    populate,
    start_server,
)

log = logging.getLogger("bench")

# How often CA's /metrics is read to see a loop end: every 2 s, or a fifth of the scan
# interval if that is shorter, so that every snapshot falls into the wait after a loop, well
# before the next one starts. Each read costs CA a little CPU, counted in its CPU per loop.
MAX_POLL_SECONDS = 2.0
FUNCTION_SUM = "cluster_autoscaler_function_duration_seconds_sum"
FUNCTION_COUNT = "cluster_autoscaler_function_duration_seconds_count"
CA_NODES = "cluster_autoscaler_nodes_count"
CA_ERRORS = "cluster_autoscaler_errors_total"
CA_SCALED = (
    "cluster_autoscaler_scaled_up_nodes_total",
    "cluster_autoscaler_scaled_down_nodes_total",
)
OUR_REQUESTS = "cloudscale_autoscaler_grpc_requests_total"
OUR_SECONDS = "cloudscale_autoscaler_grpc_request_duration_seconds_sum"
NO_SCRAPE = Scrape([])


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.monotonic()
    ca: Scrape
    ours: Scrape
    cpu: dict[str, float]  # CPU seconds so far: "server", "ca", "emulator"

    @property
    def loops(self) -> int:
        return int(self.ca.value(FUNCTION_COUNT, function="main"))


@dataclass(frozen=True)
class Window:
    """What happened between two snapshots."""

    start: Snapshot
    end: Snapshot

    def ca_mean(self, function: str) -> float | None:
        """CA's mean duration of `function` in the window (None: it did not run)."""
        calls = self._ca_delta(FUNCTION_COUNT, function)
        return self._ca_delta(FUNCTION_SUM, function) / calls if calls else None

    def _ca_delta(self, name: str, function: str) -> float:
        return self.end.ca.value(name, function=function) - self.start.ca.value(
            name, function=function
        )

    def rpcs(self) -> dict[str, float]:
        before = self.start.ours.by_label(OUR_REQUESTS, "method")
        after = self.end.ours.by_label(OUR_REQUESTS, "method")
        return {m: n - before.get(m, 0.0) for m, n in after.items() if n > before.get(m, 0.0)}

    def our_seconds(self, method: str) -> float:
        return self.end.ours.value(OUR_SECONDS, method=method) - self.start.ours.value(
            OUR_SECONDS, method=method
        )

    def figures(self, loops: int) -> dict[str, Any]:
        """Per loop: RPCs by method, our Refresh time, CPU, wall time between snapshots."""
        rpcs = {method: calls / loops for method, calls in sorted(self.rpcs().items())}
        cpu = {role: (self.end.cpu[role] - self.start.cpu[role]) / loops for role in self.end.cpu}
        return {
            "rpcs": rpcs,
            "rpcs_total": sum(rpcs.values()),
            "our_refresh_s": self.our_seconds("Refresh") / loops,
            "ca_main_s": self.ca_mean("main"),
            "ca_cloud_provider_refresh_s": self.ca_mean("cloudProviderRefresh"),
            "server_cpu_s": cpu["server"],
            "ca_cpu_s": cpu["ca"],
            "emulator_cpu_s": cpu["emulator"],
            "wall_s": (self.end.at - self.start.at) / loops,
        }


@dataclass
class RealCaBench:
    """Everything the measurements of one run share."""

    plan: RealCaPlan
    procs: Processes
    pki: Pki
    emulator: Proc
    admin: EmulatorAdmin
    kube: Kube
    binaries: dict[str, Path]  # version -> CA binary
    workdir: Path


def run_sizes(bench: RealCaBench) -> list[dict[str, Any]]:
    """Every generation at every size: one population and its Nodes per size."""
    core = kubenodes.api(bench.kube)
    rows = []
    for size in bench.plan.sizes:
        log.info("real CA, N=%d: populating the emulator and registering the Nodes", size)
        population = populate(bench.admin, Layout(size, 1))
        nodes = kubenodes.node_names(population)
        kubenodes.remove_all(core)
        kubenodes.register(core, nodes)
        if bad := kubenodes.not_ready(core, nodes):
            raise RuntimeError(f"{len(bad)} Nodes are not Ready and untainted, e.g. {bad[:3]}")
        for version in bench.plan.generations:
            log.info("real CA %s, N=%d: %d loops after the first", version, size,
                     bench.plan.steady_loops)  # fmt: skip
            rows.append(measure(bench, version, population, len(nodes)))
    return rows


def measure(bench: RealCaBench, version: str, population: Population, nodes: int) -> dict[str, Any]:
    """Our server (started afresh) and CA `version` (started last): CA's first loop and the
    steady loops after it."""
    layout = population.layout
    settings = ServerSettings(metrics=True, keep_population=True)
    name = f"{version}-{layout.size}"
    server = start_server(bench.procs, bench.workdir / f"server-{name}", bench.pki, bench.admin,
                          layout, settings)  # fmt: skip
    ca: Autoscaler | None = None
    try:
        before = _snapshot(NO_SCRAPE, server, bench.emulator, None)
        ca = start_autoscaler(bench.procs, version, bench.binaries[version], bench.kube, server,
                              bench.pki, bench.workdir / f"ca-{name}",
                              bench.plan.scan_interval_s)  # fmt: skip
        snapshots = _watch_loops(bench, ca, server, version, 1 + bench.plan.steady_loops)
        _check(version, snapshots[-1].ca, nodes, ca.proc)
        first, last = snapshots[0], snapshots[-1]
        return {
            "generation": version,
            "size": layout.size,
            "nodes": nodes,
            "loops": last.loops - first.loops,
            # From CA's start (its informers' first listing included) to its first loop's end.
            "first_loop": Window(before, first).figures(1),
            "steady": Window(first, last).figures(last.loops - first.loops),
            "not_ok": _not_ok(last.ours),
            "server_rss_bytes": server.proc.memory()["VmRSS"],
            "ca_rss_bytes": ca.proc.memory()["VmRSS"],
        }
    finally:
        if ca is not None:
            bench.procs.stop(ca.proc)
        bench.procs.stop(server.proc)


def _snapshot(ca_scrape: Scrape, server: Endpoint, emulator: Proc, ca: Proc | None) -> Snapshot:
    assert server.metrics_url is not None
    ours = scrape(server.metrics_url)
    cpu = {"server": server.proc.cpu(), "emulator": emulator.cpu(),
           "ca": 0.0 if ca is None else ca.cpu()}  # fmt: skip
    return Snapshot(time.monotonic(), ca_scrape, ours, cpu)


def _scrape_ca(ca: Autoscaler) -> Scrape:
    try:
        return scrape(ca.metrics_url)
    except (urllib.error.URLError, ConnectionError):
        return NO_SCRAPE  # not listening yet


def _watch_loops(
    bench: RealCaBench, ca: Autoscaler, server: Endpoint, version: str, loops: int
) -> list[Snapshot]:
    """A snapshot at the end of each of CA's first `loops` loops."""
    snapshots: list[Snapshot] = []
    seen = 0
    poll = min(MAX_POLL_SECONDS, bench.plan.scan_interval_s / 5)
    deadline = time.monotonic() + bench.plan.loop_timeout_s
    while seen < loops:
        ca.proc.check_alive()
        current = _scrape_ca(ca)
        count = int(current.value(FUNCTION_COUNT, function="main"))
        if count > seen + 1:
            raise RuntimeError(f"CA {version}: loop {seen + 1} ended unseen (the machine stalled?)")
        if count > seen:
            snapshots.append(_snapshot(current, server, bench.emulator, ca.proc))
            seen = count
            deadline = time.monotonic() + bench.plan.loop_timeout_s
        elif time.monotonic() > deadline:
            raise RuntimeError(
                f"CA {version}: loop {seen + 1} did not end within "
                f"{bench.plan.loop_timeout_s:.0f}s; its log:\n{ca.proc.log_tail()}"
            )
        time.sleep(poll)
    return snapshots


def _check(version: str, last: Scrape, nodes: int, ca: Proc) -> None:
    """CA saw every Node Ready, and had nothing to do and no error: else the loops measured
    are not idle ones."""
    states = {s: n for s, n in last.by_label(CA_NODES, "state").items() if n}
    errors = {t: n for t, n in last.by_label(CA_ERRORS, "type").items() if n}
    scaled = {name: last.value(name) for name in CA_SCALED if last.value(name)}
    if states != {"ready": nodes} or errors or scaled:
        raise RuntimeError(
            f"CA {version} did not see an idle cluster of {nodes} Ready nodes: nodes by state "
            f"{states}, errors {errors}, scaled {scaled}; its log:\n{ca.log_tail()}"
        )


def _not_ok(ours: Scrape) -> dict[str, dict[str, float]]:
    """Calls our server answered with another code than OK, by method and code."""
    out: dict[str, dict[str, float]] = {}
    for sample in ours.samples:
        code = sample.labels.get("code")
        if sample.name == OUR_REQUESTS and code not in (None, "OK") and sample.value:
            out.setdefault(sample.labels["method"], {})[str(code)] = sample.value
    return out
