"""The workloads. Each returns plain JSON-able figures; seconds unless a key says otherwise."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import GoClient
from bench.plan import BenchPlan, IncreasePlan, LoopPattern
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


def _nodes_file(bench: Bench, population: Population) -> Path:
    layout = population.layout
    path = bench.workdir / f"nodes-{layout.size}-{layout.groups}.json"
    path.write_text(json.dumps({"nodes": population.nodes()}))
    return path


def ca_loop(
    bench: Bench, endpoint: Endpoint, population: Population, pattern: LoopPattern, loops: int
) -> dict[str, Any]:
    """a. `loops` idle CA loops of `pattern` against one server: wall time, the server's and
    the emulator's CPU per loop, time per RPC (phase), the server's RSS afterwards."""
    layout = population.layout
    args = ["-nodes", str(_nodes_file(bench, population)), "-loops", str(loops)]
    measured = bench.client.measure(
        "loop",
        endpoint,
        [*args, *pattern.client_args()],
        bench.plan.max_seconds,
        [endpoint.proc, bench.emulator],
    )
    result = measured.result
    done = result["loop"]["count"]
    if done == 0:
        raise RuntimeError(
            f"{pattern.name} loop at N={layout.size}, G={layout.groups} on "
            f"{endpoint.proc.name}: no loop finished"
        )
    expected = pattern.calls_per_loop(result["nodes"], result["managed"], result["groups"])
    if result["calls_per_loop"] != expected:
        raise RuntimeError(
            f"{pattern.name} loop on {endpoint.proc.name}: calls {result['calls_per_loop']}, "
            f"expected {expected}"
        )
    return {
        "nodes": result["nodes"],
        "managed_nodes": result["managed"],
        "calls_per_loop": result["calls_per_loop"],
        "rpcs_per_loop": result["rpcs_per_loop"],
        "loops": done,
        "loop_mean_s": result["loop"]["mean_s"],
        "loop_min_s": result["loop"]["min_s"],
        "provider_cpu_per_loop_s": measured.cpu[endpoint.proc.name] / done,
        "emulator_cpu_per_loop_s": measured.cpu["emulator"] / done,
        "phases_mean_s": {name: s["mean_s"] for name, s in result["phases"].items()},
        "provider_rss_bytes": endpoint.proc.memory()["VmRSS"],
    }


def ca_loops(bench: Bench, server: Endpoint, population: Population) -> list[dict[str, Any]]:
    """a. Each pattern's CA loop against our server and the Go reference, in turn."""
    layout = population.layout
    state = write_goref_state(bench.workdir, population)
    goref = start_goref(bench.procs, bench.goref_binary, state, bench.pki)
    rows = []
    try:
        for pattern in bench.plan.loop_patterns:
            loops = bench.plan.loops
            ours = ca_loop(bench, server, population, pattern, loops)
            reference = ca_loop(bench, goref, population, pattern, loops)
            rows.append(
                {
                    "pattern": pattern.name,
                    "size": layout.size,
                    "groups": layout.groups,
                    "ours": ours,
                    "goref": reference,
                    "wall_ratio": ours["loop_mean_s"] / reference["loop_mean_s"],
                    "cpu_ratio": _ratio(
                        ours["provider_cpu_per_loop_s"], reference["provider_cpu_per_loop_s"]
                    ),
                }
            )
    finally:
        bench.procs.stop(goref.proc)
    return rows


SINGLE_CASES = (
    ("NodeGroupForNode (own node)", "NodeGroupForNode", "own"),
    ("NodeGroupForNode (foreign node)", "NodeGroupForNode", "foreign"),
    ("TargetSize", "TargetSize", ""),
    ("GetOptions", "GetOptions", ""),
    ("TemplateNodeInfo", "TemplateNodeInfo", ""),
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
    if rpc == "TemplateNodeInfo":
        return "nodeBytes=true"
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


FORWARDED_RPCS = ("IncreaseSize", "DeleteNodes", "Refresh")


def forwarded_rpcs(bench: Bench, server: Endpoint, population: Population) -> list[dict[str, Any]]:
    """f. The RPCs our engine answers per call (CA's forwarded calls), one at a time on our
    server: IncreaseSize(delta=1), DeleteNodes of one node of the group (the
    last servers of the population: run this after every other workload of the stack),
    Refresh. Server CPU per call includes what it spent on the emulator's answers."""
    plan = bench.plan
    group = population.layout.group_names[0]
    victims = population.own[group][-(plan.forwarded_calls + plan.forwarded_warmup) :]
    victims_file = bench.workdir / "delete-nodes.json"
    victims_file.write_text(
        json.dumps({"nodes": [{"providerID": f"cloudscale://{u}", "name": u} for u in victims]})
    )
    rows = []
    for rpc in FORWARDED_RPCS:
        args = ["-calls", str(plan.forwarded_calls), "-warmup", str(plan.forwarded_warmup)]
        if rpc == "Refresh":
            measured = bench.client.measure(
                "refresh", server, args[:2], plan.max_seconds, [server.proc]
            )
            latency, calls = measured.result["latency"], measured.result["latency"]["count"]
        else:
            args += ["-rpc", rpc, "-group", group, "-nodes", str(victims_file)]
            measured = bench.client.measure("single", server, args, plan.max_seconds, [server.proc])
            result = measured.result
            if result["errors"]:
                errors, answer = result["errors"], result["answer"]
                raise RuntimeError(f"{rpc} on our server: {errors} errors, the last: {answer}")
            latency, calls = result["latency"], result["latency"]["count"] + result["warmup"]
        rows.append(
            {
                "rpc": rpc,
                "size": population.layout.size,
                "groups": population.layout.groups,
                "calls": latency["count"],
                "mean_us": latency["mean_s"] * 1e6,
                "p50_us": latency["p50_s"] * 1e6,
                "p99_us": latency["p99_s"] * 1e6,
                "cpu_per_call_us": measured.cpu[server.proc.name] / calls * 1e6,
            }
        )
    return rows


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


def memory(bench: Bench, server: Endpoint, layout: Layout, listening: int) -> dict[str, Any]:
    """e. The provider's resident memory once it listened (`listening`), now (after Refresh and
    a CA loop), after a storm of Refresh calls back to back (each listing all N: the memory
    one listing takes must come back), and at its peak."""
    after_loop = server.proc.memory()
    storm = bench.plan.storm_refreshes
    bench.client.measure("refresh", server, ["-calls", str(storm)], bench.plan.max_seconds, [])
    after_storm = server.proc.memory()
    return {
        "size": layout.size,
        "groups": layout.groups,
        "listening_rss_bytes": listening,
        "rss_bytes": after_loop["VmRSS"],
        "storm_refreshes": storm,
        "after_storm_rss_bytes": after_storm["VmRSS"],
        "peak_rss_bytes": after_storm["VmHWM"],
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
