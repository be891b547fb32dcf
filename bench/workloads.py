"""The workloads. Each returns plain JSON-able figures; seconds unless a key says otherwise."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import GoClient
from bench.plan import BenchPlan, IncreasePlan
from bench.procs import Proc, Processes
from bench.stack import (
    CLUSTER,
    EmulatorAdmin,
    Endpoint,
    Layout,
    Pki,
    Population,
    ServerSettings,
    populate,
    start_goref,
    start_pyref,
    start_server,
    write_goref_state,
)


@dataclass
class Bench:
    """Everything the workloads share during a run."""

    plan: BenchPlan
    procs: Processes
    client: GoClient
    goref_binary: Path
    pki: Pki
    emulator: Proc
    admin: EmulatorAdmin
    workdir: Path


def ca_loop(bench: Bench, server: Endpoint, population: Population, loops: int) -> dict[str, Any]:
    """a. Refresh, NodeGroups, NodeGroupForNode per node, TargetSize + NodeGroupNodes +
    TemplateNodeInfo per group, GetOptions per managed node; `loops` times."""
    layout = population.layout
    nodes_file = bench.workdir / f"nodes-{layout.size}-{layout.groups}.json"
    nodes_file.write_text(json.dumps({"nodes": population.nodes()}))
    measured = bench.client.measure(
        "loop",
        server,
        ["-nodes", str(nodes_file), "-loops", str(loops)],
        bench.plan.max_seconds,
        [server.proc, bench.emulator],
    )
    result = measured.result
    done = result["loop"]["count"]
    if done == 0:
        raise RuntimeError(f"CA loop at N={layout.size}, G={layout.groups}: no loop finished")
    return {
        "size": layout.size,
        "groups": layout.groups,
        "nodes": result["nodes"],
        "managed_nodes": result["managed"],
        "instances": result["instances"],
        "rpcs_per_loop": result["rpcs_per_loop"],
        "loops": done,
        "loop_mean_s": result["loop"]["mean_s"],
        "loop_min_s": result["loop"]["min_s"],
        "provider_cpu_per_loop_s": measured.cpu["server"] / done,
        "emulator_cpu_per_loop_s": measured.cpu["emulator"] / done,
        "phases_mean_s": {name: s["mean_s"] for name, s in result["phases"].items()},
        "provider_rss_bytes": server.proc.memory()["VmRSS"],
    }


SINGLE_CASES = (
    ("NodeGroupForNode (own node)", "NodeGroupForNode", "own"),
    ("NodeGroupForNode (foreign node)", "NodeGroupForNode", "foreign"),
    ("TargetSize", "TargetSize", ""),
    ("GetOptions", "GetOptions", ""),
)


def _single_args(population: Population, rpc: str, which: str, plan: BenchPlan) -> list[str]:
    group = population.layout.group_names[0]
    args = ["-rpc", rpc, "-calls", str(plan.single_calls), "-warmup", str(plan.single_warmup)]
    if rpc == "NodeGroupForNode":
        uuid = population.own[group][0] if which == "own" else population.untagged[0]
        return [*args, "-provider-id", f"cloudscale://{uuid}"]
    return [*args, "-group", group]


def _expected_answer(population: Population, rpc: str, which: str) -> str:
    group = population.layout.group_names[0]
    if rpc == "NodeGroupForNode":
        return f"group={group if which == 'own' else ''}"
    if rpc == "TargetSize":
        return f"targetSize={len(population.own[group])}"
    return "scaleDownUtilizationThreshold=0.6"


def _one_single(
    bench: Bench, endpoint: Endpoint, args: list[str], expected: str, label: str
) -> dict[str, Any]:
    measured = bench.client.measure(
        "single", endpoint, args, bench.plan.max_seconds, [endpoint.proc]
    )
    result = measured.result
    if result["errors"] or result["answer"] != expected:
        raise RuntimeError(
            f"{label} on {endpoint.proc.name}: {result['errors']} errors, "
            f"answer {result['answer']!r}, expected {expected!r}"
        )
    latency = result["latency"]
    calls = latency["count"] + result["warmup"]
    return {
        "mean_us": latency["mean_s"] * 1e6,
        "p50_us": latency["p50_s"] * 1e6,
        "p99_us": latency["p99_s"] * 1e6,
        "cpu_per_call_us": measured.cpu[endpoint.proc.name] / calls * 1e6,
        "calls": latency["count"],
    }


def _ratio(ours: float, reference: float) -> float | None:
    # CPU time comes in clock ticks (10 ms): a reference too cheap to register has no ratio.
    return ours / reference if reference > 0 else None


def single_rpcs(bench: Bench, server: Endpoint, population: Population) -> list[dict[str, Any]]:
    """b. Each RPC called sequentially on our server, the Go reference and the bare grpc.aio
    server (the Python floor), in turn; the best round of each (lowest mean) is kept. Ours is
    reported as a ratio to the Go reference, and so is the floor."""
    state = write_goref_state(bench.workdir, population)
    goref = start_goref(bench.procs, bench.goref_binary, state, bench.pki)
    pyref = start_pyref(bench.procs, state, bench.pki)
    servers = (("ours", server), ("goref", goref), ("pyref", pyref))
    try:
        rows = []
        for label, rpc, which in SINGLE_CASES:
            args = _single_args(population, rpc, which, bench.plan)
            expected = _expected_answer(population, rpc, which)
            best: dict[str, dict[str, Any]] = {}
            for _ in range(bench.plan.single_rounds):
                for name, endpoint in servers:
                    figures = _one_single(bench, endpoint, args, expected, label)
                    if name not in best or figures["mean_us"] < best[name]["mean_us"]:
                        best[name] = figures
            rows.append(_single_row(label, best))
        return rows
    finally:
        bench.procs.stop(pyref.proc)
        bench.procs.stop(goref.proc)


def _single_row(label: str, best: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ours, goref, pyref = best["ours"], best["goref"], best["pyref"]
    return {
        "rpc": label,
        "ours": ours,
        "goref": goref,
        "pyref": pyref,
        "ratio": ours["mean_us"] / goref["mean_us"],
        "p50_ratio": ours["p50_us"] / goref["p50_us"],
        "cpu_ratio": _ratio(ours["cpu_per_call_us"], goref["cpu_per_call_us"]),
        "floor_ratio": pyref["mean_us"] / goref["mean_us"],
        "over_floor": ours["mean_us"] / pyref["mean_us"],
    }


def refresh(bench: Bench, server: Endpoint, layout: Layout) -> dict[str, Any]:
    """c. Refresh alone: end-to-end time, and the CPU our server and the emulator spent."""
    calls = bench.plan.refresh_calls
    measured = bench.client.measure(
        "refresh",
        server,
        ["-calls", str(calls)],
        bench.plan.max_seconds,
        [server.proc, bench.emulator],
    )
    latency = measured.result["latency"]
    done = latency["count"]
    return {
        "size": layout.size,
        "groups": layout.groups,
        "listed_servers": layout.size,
        "calls": done,
        "mean_s": latency["mean_s"],
        "min_s": latency["min_s"],
        "max_s": latency["max_s"],
        "provider_cpu_per_call_s": measured.cpu["server"] / done,
        "emulator_cpu_per_call_s": measured.cpu["emulator"] / done,
    }


def memory(server: Endpoint, layout: Layout) -> dict[str, Any]:
    """e. The provider's resident memory now (after Refresh and a CA loop) and at its peak."""
    mem = server.proc.memory()
    return {
        "size": layout.size,
        "groups": layout.groups,
        "rss_bytes": mem["VmRSS"],
        "peak_rss_bytes": mem["VmHWM"],
    }


def ideal_completion(plan: IncreasePlan) -> float:
    """The earliest time the last of `delta` creates can finish under the limits: at most
    `max_concurrent_creates` at once, each `latency_ms` long, each started only with a token
    from a bucket of `requests_per_second` (capacity one second's worth, as our client's)."""
    latency = plan.latency_ms / 1000.0
    rate = plan.requests_per_second
    capacity = max(1.0, rate)
    tokens, updated = capacity, 0.0
    finishes: list[float] = []
    for i in range(plan.delta):
        # A create slot frees when the create `max_concurrent_creates` earlier finished.
        earlier = i - plan.max_concurrent_creates
        ready = finishes[earlier] if earlier >= 0 else 0.0
        ready = max(ready, updated)  # the bucket serves in order
        tokens = min(capacity, tokens + (ready - updated) * rate)
        if tokens < 1.0:
            ready += (1.0 - tokens) / rate
            tokens = 1.0
        tokens -= 1.0
        updated = ready
        finishes.append(ready + latency)
    return max(finishes) if finishes else 0.0


def increase(bench: Bench) -> dict[str, Any]:
    """d. IncreaseSize(delta) with slow creates and our rate limit: when the RPC returns, and
    when the last server exists, against the time the limits allow."""
    plan = bench.plan.increase
    layout = Layout(size=10, groups=1)
    populate(bench.admin, layout)
    settings = ServerSettings(plan.max_concurrent_creates, plan.requests_per_second)
    server = start_server(
        bench.procs, bench.workdir / "increase", bench.pki, bench.admin, layout, settings
    )
    try:
        bench.admin.set_faults({"latency": {"create_server": {"fixed_ms": plan.latency_ms}}})
        measured = bench.client.measure(
            "increase",
            server,
            [
                "-group",
                layout.group_names[0],
                "-delta",
                str(plan.delta),
                "-emulator",
                bench.admin.base,
            ],
            plan.max_seconds,
            [server.proc, bench.emulator],
        )
    finally:
        bench.admin.clear_faults()
        bench.procs.stop(server.proc)
    result = measured.result
    ideal = ideal_completion(plan)
    # None when not every server appeared within the time bound.
    all_created = None if result["timed_out"] else result["all_created_s"]
    return {
        "delta": plan.delta,
        "create_latency_s": plan.latency_ms / 1000.0,
        "max_concurrent_creates": plan.max_concurrent_creates,
        "requests_per_second": plan.requests_per_second,
        "cluster": CLUSTER,
        "rpc_s": result["rpc_s"],
        "rpc_error": result["rpc_error"],
        "created": result["created"],
        "all_created_s": all_created,
        "ideal_s": ideal,
        "over_ideal": None if all_created is None or not ideal else all_created / ideal - 1.0,
        "provider_cpu_s": measured.cpu["server"],
    }
