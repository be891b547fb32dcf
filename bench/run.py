"""One benchmark run: build, start the processes, run every workload, collect the figures."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import gobuild, workloads
from bench.client import GoClient
from bench.plan import BenchPlan
from bench.procs import Processes
from bench.report import load_average, machine
from bench.stack import Layout, ServerSettings, make_certs, populate, start_emulator, start_server

log = logging.getLogger("bench")


def run(plan: BenchPlan, out: Path) -> dict[str, Any]:
    started = time.time()
    description = machine()  # before the run: its load average is the one at the start
    log.info("building the Go client and reference server")
    binaries = gobuild.build(out)
    workdir = out / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Processes(out / "logs")
    results: dict[str, Any] = {
        "ca_loop": [],
        "single_rpcs": [],
        "refresh": [],
        "memory": [],
        "forwarded_rpcs": [],
        "increase": None,
    }
    try:
        pki = make_certs(workdir / "pki")
        emulator, admin = start_emulator(procs)
        bench = workloads.Bench(
            plan,
            procs,
            GoClient(binaries.client, pki),
            binaries.goref,
            pki,
            emulator,
            admin,
            workdir,
        )
        for size, groups in plan.stacks():
            _run_stack(bench, Layout(size, groups), results)
        log.info("IncreaseSize(%d)", plan.increase.delta)
        results["increase"] = workloads.increase(bench)
    finally:
        procs.stop_all()
    return {
        "machine": description,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started,
        "load_average_at_end": load_average(),
        "plan": asdict(plan),
        "results": results,
    }


def _run_stack(bench: workloads.Bench, layout: Layout, results: dict[str, Any]) -> None:
    plan = bench.plan
    size, groups = layout.size, layout.groups
    log.info("stack N=%d G=%d: populating", size, groups)
    population = populate(bench.admin, layout)
    server = start_server(
        bench.procs,
        bench.workdir / f"server-{size}-{groups}",
        bench.pki,
        bench.admin,
        layout,
        ServerSettings(),
    )
    # Before any call: the inventory is loaded before the server listens.
    listening = server.proc.memory()["VmRSS"]
    try:
        if (size, groups) == (plan.single_size, plan.single_groups):
            log.info("stack N=%d G=%d: single RPCs", size, groups)
            results["single_rpcs"] = workloads.single_rpcs(bench, server, population)
        if size in plan.refresh_sizes and groups == plan.groups:
            log.info("stack N=%d G=%d: Refresh", size, groups)
            results["refresh"].append(workloads.refresh(bench, server, layout))
        if size in plan.loop_sizes and groups in plan.loop_groups:
            log.info("stack N=%d G=%d: CA loops, ours and Go reference", size, groups)
            results["ca_loop"] += workloads.ca_loops(bench, server, population)
        if size in plan.rss_sizes and groups == plan.groups:
            log.info("stack N=%d G=%d: memory after a CA loop", size, groups)
            pattern = plan.loop_patterns[-1]
            workloads.ca_loop(bench, server, population, pattern, 1)
            results["memory"].append(workloads.memory(bench, server, layout, listening))
        if (size, groups) == (plan.single_size, plan.single_groups):
            # Last: it deletes and creates servers of the stack.
            log.info("stack N=%d G=%d: forwarded RPCs", size, groups)
            results["forwarded_rpcs"] = workloads.forwarded_rpcs(bench, server, population)
    finally:
        bench.procs.stop(server.proc)
