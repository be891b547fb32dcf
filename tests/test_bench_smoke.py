"""The benchmark (`python -m bench`, bench/README.md) keeps working: its smoke configuration
(N=100, G=1, two CA loops of each CA generation's pattern, a small IncreaseSize) runs end to
end, as real processes on loopback, and its JSON has every workload's figures and the calls
each CA loop pattern made. Timings are never asserted."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A cold build compiles grpc-go and protobuf-go (and two protoc plugins) on 2 cores.
TIMEOUT = 1200.0

LOOP_KEYS = {
    "nodes",
    "managed_nodes",
    "rpcs_per_loop",
    "loops",
    "loop_mean_s",
    "provider_cpu_per_loop_s",
    "emulator_cpu_per_loop_s",
    "phases_mean_s",
    "provider_rss_bytes",
}
# What one idle loop of each CA generation sends with 100 nodes of ours in one group and 10
# static nodes (bench/README.md, "The CA loop patterns"): ours are looked up once (CA caches
# the answer), static ones at every lookup site (an empty answer is not cached).
CALLS_PER_LOOP = {
    "CA 1.34": {
        "Refresh": 1,
        "NodeGroups": 1,
        "NodeGroupForNode": 100 + 10 * 3,
        "TemplateNodeInfo": 1,
        "TargetSize": 4,
        "GetOptions": 0,
    },
    "CA 1.36": {
        "Refresh": 1,
        "NodeGroups": 1,
        "NodeGroupForNode": 100 + 10 * 4,
        "TemplateNodeInfo": 1,
        "TargetSize": 4,
        "GetOptions": 2 * 100,
    },
}
FORWARDED_RPCS = ["IncreaseSize", "DeleteNodes", "Refresh"]
SINGLE_RPCS = [
    "NodeGroupForNode (own node)",
    "NodeGroupForNode (foreign node)",
    "TargetSize",
    "GetOptions",
    "TemplateNodeInfo",
]
PER_SERVER_KEYS = {"mean_us", "p50_us", "p99_us", "cpu_per_call_us", "calls"}
REFRESH_KEYS = {
    "size",
    "calls",
    "mean_s",
    "min_s",
    "provider_cpu_per_call_s",
    "emulator_cpu_per_call_s",
}


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if shutil.which("go") is None:
        pytest.skip("go is not installed: the benchmark's client and reference server are Go")
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"python -m bench --smoke failed:\n{done.stdout}\n{done.stderr}"
    assert (out / "results.md").read_text().startswith("# Benchmark results")
    result: dict[str, Any] = json.loads((out / "results.json").read_text())
    result["out"] = str(out)
    return result


@pytest.mark.timeout(TIMEOUT + 60)
def test_machine_is_described(report: dict[str, Any]) -> None:
    machine = report["machine"]
    assert machine["nproc"] >= 1
    assert machine["cpu_model"] and machine["python"] and machine["go"].startswith("go version")
    assert machine["memory_bytes"] > 0


@pytest.mark.timeout(TIMEOUT + 60)
def test_ca_loop_patterns_make_each_generations_calls(report: dict[str, Any]) -> None:
    rows = report["results"]["ca_loop"]
    assert [row["pattern"] for row in rows] == list(CALLS_PER_LOOP)
    for row in rows:
        assert (row["size"], row["groups"]) == (100, 1)
        assert is_number(row["wall_ratio"]) and row["wall_ratio"] > 0
        for server in ("ours", "goref"):
            loop = row[server]
            assert loop.keys() >= LOOP_KEYS
            assert loop["loops"] == 2
            # 100 servers of ours plus 10 static nodes, only ours managed.
            assert (loop["nodes"], loop["managed_nodes"]) == (110, 100)
            assert loop["calls_per_loop"] == CALLS_PER_LOOP[row["pattern"]], server
            assert loop["rpcs_per_loop"] == sum(CALLS_PER_LOOP[row["pattern"]].values())
            assert set(loop["phases_mean_s"]) == set(CALLS_PER_LOOP[row["pattern"]])
            assert all(is_number(v) for v in loop["phases_mean_s"].values())
            assert all(is_number(loop[k]) for k in LOOP_KEYS - {"phases_mean_s"})


@pytest.mark.timeout(TIMEOUT + 60)
def test_forwarded_rpc_figures(report: dict[str, Any]) -> None:
    rows = report["results"]["forwarded_rpcs"]
    assert [row["rpc"] for row in rows] == FORWARDED_RPCS
    for row in rows:
        assert row["calls"] == 5
        assert all(is_number(row[k]) for k in PER_SERVER_KEYS)


@pytest.mark.timeout(TIMEOUT + 60)
def test_single_rpc_figures_have_go_reference_ratios(report: dict[str, Any]) -> None:
    rows = report["results"]["single_rpcs"]
    assert [row["rpc"] for row in rows] == SINGLE_RPCS
    for row in rows:
        for server in ("ours", "goref", "pyref"):
            assert row[server].keys() >= PER_SERVER_KEYS
            assert all(is_number(row[server][k]) for k in PER_SERVER_KEYS)
            assert row[server]["calls"] == 50
        for ratio in ("ratio", "p50_ratio", "floor_ratio", "over_floor"):
            assert is_number(row[ratio]) and row[ratio] > 0, ratio


@pytest.mark.timeout(TIMEOUT + 60)
def test_refresh_and_memory_figures(report: dict[str, Any]) -> None:
    [refresh] = report["results"]["refresh"]
    assert refresh.keys() >= REFRESH_KEYS
    assert (refresh["size"], refresh["calls"]) == (100, 2)
    assert all(is_number(refresh[k]) for k in REFRESH_KEYS)
    [memory] = report["results"]["memory"]
    assert (memory["size"], memory["storm_refreshes"]) == (100, 3)
    for key in ("listening_rss_bytes", "rss_bytes", "after_storm_rss_bytes"):
        assert 0 < memory[key] <= memory["peak_rss_bytes"], key


@pytest.mark.timeout(TIMEOUT + 60)
def test_increase_figures(report: dict[str, Any]) -> None:
    increase = report["results"]["increase"]
    assert increase["rpc_error"] == ""
    assert increase["created"] == increase["delta"] == 5
    for key in ("rpc_s", "all_created_s", "ideal_s", "over_ideal", "provider_cpu_s"):
        assert is_number(increase[key]), key


@pytest.mark.timeout(TIMEOUT + 60)
def test_plots_show_each_series_and_are_linked(report: dict[str, Any]) -> None:
    out = Path(report["out"])
    loop = (out / "loop.svg").read_text()
    # Text stays text in the SVGs (svg.fonttype none): every series is named in the file.
    for pattern in CALLS_PER_LOOP:
        series = f"{pattern}, G=1"
        assert f">{series}, Go reference<" in loop and f">{series}<" in loop, pattern
    latency = (out / "latency.svg").read_text()
    for name in [*SINGLE_RPCS, "ours (mean)", "Go reference (p99)", "Python floor"]:
        assert name in latency, name
    assert "<dc:date>" not in loop + latency, "a date makes every rerun a diff"
    results = (out / "results.md").read_text()
    assert "![loop](loop.svg)" in results and "![latency](latency.svg)" in results
