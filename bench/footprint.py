"""Where the provider's resident memory goes: `python -m bench.footprint`.

Three measurements, each in fresh processes of its own (findings in PROFILING.md, "Memory
footprint"):

- start: a child imports what `serve` imports, one top-level package at a time (the standard
  library first, then each third-party package, then ours), reading VmRSS after each; a second
  child imports the same under tracemalloc and groups the Python heap by package;
- serve: the real `cloudscale-autoscaler serve` against the emulator holding N servers of
  ours (the bench's layout, G=10): VmRSS once it listens (the inventory is loaded before it
  does) and after six Refresh calls over mTLS;
- inventory: a child starts the provider in-process with no server of ours, then lists N and
  publishes the answers to the transport, as a Refresh does. Under tracemalloc it reports the
  Python heap's growth grouped by file and line; without, the RSS growth. RSS growth minus
  Python's is what the rest holds: the compiled transport's copy of the answers, and malloc's
  own overhead. Finally `malloc_trim(0)` shows what glibc still held freed.

Nothing leaves the machine; every process listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.procs import Processes, cli, free_port, memory_bytes
from bench.stack import (
    EmulatorAdmin,
    Endpoint,
    Layout,
    Pki,
    ServerSettings,
    make_certs,
    populate,
    start_emulator,
    write_server_config,
)

ROOT = Path(__file__).resolve().parent.parent
GROUPS = 10
REFRESHES = 6
MB = 1_000_000


def _rss() -> int:
    return memory_bytes(os.getpid())["VmRSS"]


def _child(module: str, *args: str) -> Any:
    """Run `python -m <module> <args>` and return the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


# --- inventory: per server, in-process ---------------------------------------------------------


async def _inventory(config_path: Path, admin_port: int, size: int) -> dict[str, Any]:
    from cloudscale_autoscaler.app import start_provider
    from cloudscale_autoscaler.config.loader import load_config

    admin = EmulatorAdmin(admin_port)
    admin.reset()
    running = await start_provider(load_config(config_path))
    try:
        engine = running.provider.service.engine
        await engine.refresh()  # anything a first call allocates once, not per server
        engine.on_change()
        gc.collect()
        before = _measure()
        populate(admin, Layout(size, GROUPS))
        gc.collect()
        listed = _measure()  # what populating cost this process (the admin's answers)
        await engine.refresh()
        engine.on_change()  # the publish that follows a Refresh
        gc.collect()
        after = _measure()
        trimmed = _trim()
        return {"size": size, "before": before, "listed": listed, "after": after, **trimmed}
    finally:
        await running.stop(0)


def _measure() -> dict[str, Any]:
    measured: dict[str, Any] = {"rss": _rss()}
    if tracemalloc.is_tracing():
        measured["snapshot"] = tracemalloc.take_snapshot()
    return measured


def _trim() -> dict[str, int]:
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "malloc_trim"):
        return {}
    libc.malloc_trim(0)
    return {"trimmed_rss": _rss()}


def child_inventory(traced: bool) -> dict[str, Any]:
    config, admin_port, size = Path(sys.argv[-3]), int(sys.argv[-2]), int(sys.argv[-1])
    if traced:
        tracemalloc.start()
    result = asyncio.run(_inventory(config, admin_port, size))
    out: dict[str, Any] = {key: result[key] for key in ("size",) if key in result}
    out["rss_growth"] = result["after"]["rss"] - result["before"]["rss"]
    out["rss_populate"] = result["listed"]["rss"] - result["before"]["rss"]
    if "trimmed_rss" in result:
        out["trim_returned"] = result["after"]["rss"] - result["trimmed_rss"]
    if traced:
        before, after = result["before"]["snapshot"], result["after"]["snapshot"]
        diff = after.compare_to(before, "lineno")
        out["traced_growth"] = sum(d.size_diff for d in diff)
        out["by_line"] = [
            {
                "where": f"{_short(d.traceback[0].filename)}:{d.traceback[0].lineno}",
                "bytes": d.size_diff,
                "blocks": d.count_diff,
            }
            for d in diff[:15]
        ]
    return out


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for marker in ("site-packages", "src"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    return "/".join(parts[-2:])


# --- serve: the real process -------------------------------------------------------------------


def _refresh_calls(address: str, pki: Pki, count: int) -> None:
    import grpc

    from cloudscale_autoscaler.protos import externalgrpc_pb2 as pb
    from cloudscale_autoscaler.protos import externalgrpc_pb2_grpc as pb_grpc

    credentials = grpc.ssl_channel_credentials(
        pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
    )
    with grpc.secure_channel(address.replace("127.0.0.1", "localhost"), credentials) as channel:
        stub = pb_grpc.CloudProviderStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(count):
            stub.Refresh(pb.RefreshRequest(), timeout=120)


def _start_serve(
    procs: Processes, directory: Path, pki: Pki, admin: EmulatorAdmin, size: int, metrics: bool
) -> Endpoint:
    """`serve` as the bench starts it; with `metrics`, also with the metrics endpoint (which
    starts after the gRPC port, so that is waited for as well)."""
    port = free_port()
    config = write_server_config(
        directory, pki, admin, port, Layout(size, GROUPS), ServerSettings()
    )
    metrics_port = free_port()
    if metrics:
        document = yaml.safe_load(config.read_text())
        document["metrics"] = {"listen": f"127.0.0.1:{metrics_port}"}
        config.write_text(yaml.safe_dump(document, sort_keys=False))
    proc = procs.start(
        f"serve-{size}", cli("--log-level", "warning", "serve", "--config", str(config))
    )
    proc.wait_for_port(port)
    if metrics:
        proc.wait_for_port(metrics_port)
    return Endpoint(proc, f"127.0.0.1:{port}")


def serve_rss(
    work: Path, pki: Pki, admin: EmulatorAdmin, procs: Processes, size: int, metrics: bool
) -> dict[str, Any]:
    populate(admin, Layout(size, GROUPS))
    label = f"{size}-metrics" if metrics else str(size)
    server = _start_serve(procs, work / f"serve-{label}", pki, admin, size, metrics)
    try:
        started = server.proc.memory()["VmRSS"]
        _refresh_calls(server.address, pki, REFRESHES)
        memory = server.proc.memory()
        return {
            "size": size,
            "metrics": metrics,
            "start": started,
            "refreshed": memory["VmRSS"],
            "peak": memory["VmHWM"],
        }
    finally:
        procs.stop(server.proc)


# --- the run ----------------------------------------------------------------------------------


def _mb(value: float) -> str:
    return f"{value / MB:.1f}"


def _report(
    start: dict[str, Any],
    traced: dict[str, Any],
    serve: list[dict[str, Any]],
    inventory: list[tuple[dict[str, Any], dict[str, Any]]],
) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"Load average at the end: {load}",
        "",
        "### At start: per imported package (the serve path's modules, group by group)",
        "",
        "| step | RSS MB | + RSS MB | + Python heap MB |",
        "|---|---|---|---|",
    ]
    steps = zip(start["steps"], traced["steps"], strict=True)
    previous = {"rss": 0, "heap": 0}
    for plain, heap in steps:
        lines.append(
            f"| {plain['step']} | {_mb(plain['bytes'])} | "
            f"{_mb(plain['bytes'] - previous['rss'])} | {_mb(heap['bytes'] - previous['heap'])} |"
        )
        previous = {"rss": plain["bytes"], "heap": heap["bytes"]}
    lines += ["", f"{start['modules']} modules loaded."]
    lines += [
        "",
        "### The serve process (G=10)",
        "",
        f"| N | metrics.listen | RSS after start MB | after {REFRESHES} Refreshes MB | peak MB |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['size']} | {'set' if r['metrics'] else '-'} | {_mb(r['start'])} | "
        f"{_mb(r['refreshed'])} | {_mb(r['peak'])} |"
        for r in serve
    ]
    lines += [
        "",
        "### Per 1,000 servers in the inventory (after a Refresh of N, G=10)",
        "",
        "| N | RSS growth MB | Python heap growth MB | rest (transport, malloc) MB "
        "| malloc_trim returned MB |",
        "|---|---|---|---|---|",
    ]
    for plain, traced_row in inventory:
        per = plain["size"] / 1000
        rest = plain["rss_growth"] - traced_row["traced_growth"]
        lines.append(
            f"| {plain['size']} | {_mb(plain['rss_growth'] / per)} | "
            f"{_mb(traced_row['traced_growth'] / per)} | {_mb(rest / per)} | "
            f"{_mb(plain.get('trim_returned', 0) / per)} |"
        )
    for _, traced_row in inventory[-1:]:
        lines += [
            "",
            f"Python heap growth by line at N={traced_row['size']}:",
            "",
            "| where | MB | blocks |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r['where']} | {_mb(r['bytes'])} | {r['blocks']} |" for r in traced_row["by_line"]
        ]
    return "\n".join(lines) + "\n"


def run(sizes: Sequence[int], out: Path) -> str:
    packages = json.dumps(_child("bench.imports", "packages"))
    start = _child("bench.imports", "steps", packages)
    traced = _child("bench.imports", "traced", packages)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        work = Path(tmp)
        procs = Processes(out / "logs")
        try:
            pki = make_certs(work / "pki")
            _, admin = start_emulator(procs)
            serve = [serve_rss(work, pki, admin, procs, size, False) for size in (0, *sizes)]
            serve += [serve_rss(work, pki, admin, procs, size, True) for size in (0, sizes[-1])]
            config = write_server_config(
                work / "inproc", pki, admin, free_port(), Layout(1, GROUPS), ServerSettings()
            )
            port = admin.base.rsplit(":", 1)[1]
            inventory = [
                (
                    _child("bench.footprint", "inventory", str(config), port, str(size)),
                    _child("bench.footprint", "inventory-traced", str(config), port, str(size)),
                )
                for size in sizes
            ]
        finally:
            procs.stop_all()
    report = _report(start, traced, serve, inventory)
    (out / "footprint.md").write_text(report)
    return report


CHILDREN: dict[str, Callable[[], dict[str, Any]]] = {
    "inventory": lambda: child_inventory(traced=False),
    "inventory-traced": lambda: child_inventory(traced=True),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in CHILDREN:
        print(json.dumps(CHILDREN[args[0]]()))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.footprint", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    options = parser.parse_args(args)
    started = time.monotonic()
    print(run(options.sizes, options.out), end="")
    print(f"({time.monotonic() - started:.0f} s; written to {options.out / 'footprint.md'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
