"""The real-CA workload (`python -m bench --workload real-ca`, bench/README.md) keeps working:
the newest CA generation against 50 idle nodes for two loops after its first, on a loopback
kube-apiserver, with our real server and the emulator. Its JSON has every figure, and the
calls CA made are the calls an idle loop makes. Timings are never asserted.

Also: its command line refuses what it cannot run, and bench/RESULTS.md keeps the part of
the other kind of run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.autoscaler import GENERATIONS, ensure_autoscaler
from fixtures.kube import NEEDS_KUBE, apiserver_for_tests, etcd_binary
from fixtures.tools import ToolUnavailable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # bench is a top-level package of the repository

from bench import resultsmd  # noqa: E402

NEWEST = list(GENERATIONS)[-1]
SIZE = 50
STATIC = 10  # max(10, SIZE // 10) untagged servers, each a Node
LOOPS = 2
RUN_TIMEOUT = 600.0
FIGURES = ("our_refresh_s", "server_cpu_s", "ca_cpu_s", "emulator_cpu_s", "wall_s", "ca_main_s")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def bench(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # The tools first, as the other kube and CA tests get them (a skip without Go).
    etcd_binary()
    apiserver_for_tests()
    try:
        ensure_autoscaler(NEWEST)
    except ToolUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    out = tmp_path_factory.mktemp("real-ca")
    done = bench("--workload", "real-ca", "--sizes", str(SIZE), "--generations", NEWEST,
                 "--loops", str(LOOPS), "--scan-interval", "2", "--out", str(out),
                 "--no-results-md", timeout=RUN_TIMEOUT)  # fmt: skip
    assert done.returncode == 0, f"real-ca failed:\n{done.stdout}\n{done.stderr}"
    assert (out / "real-ca.md").read_text().startswith(resultsmd.REAL_CA_HEADING)
    result: dict[str, Any] = json.loads((out / "real-ca.json").read_text())
    return result


@pytest.mark.ca
@pytest.mark.kube
@NEEDS_KUBE
def test_one_row_with_every_figure(report: dict[str, Any]) -> None:
    [row] = report["results"]
    assert (row["generation"], row["size"], row["nodes"]) == (NEWEST, SIZE, SIZE + STATIC)
    assert row["loops"] == LOOPS
    for part in ("first_loop", "steady"):
        figures = row[part]
        assert all(is_number(figures[k]) and figures[k] >= 0 for k in FIGURES), (part, figures)
        # CA timed its loop and its Refresh call.
        assert figures["ca_main_s"] > 0 and is_number(figures["ca_cloud_provider_refresh_s"])
    # The first loop's wall time counts from CA's start.
    assert row["first_loop"]["wall_s"] > row["first_loop"]["ca_main_s"]
    assert row["server_rss_bytes"] > 0 and row["ca_rss_bytes"] > 0
    assert row["not_ok"] == {}, "our server refused calls of an idle loop"


@pytest.mark.ca
@pytest.mark.kube
@NEEDS_KUBE
def test_calls_are_an_idle_loops(report: dict[str, Any]) -> None:
    """Once per loop CA refreshes and lists the groups (cached until the next Refresh); each
    node of ours is looked up once per loop (cached), and every static node as often as every
    other one, at least once (an empty answer is not cached). Its first loop refreshes once
    too. No steady loop asks for a template per node."""
    [row] = report["results"]
    steady, first = row["steady"]["rpcs"], row["first_loop"]["rpcs"]
    assert steady["Refresh"] == 1 and steady["NodeGroups"] == 1, steady
    assert first["Refresh"] == 1, first
    for rpcs in (steady, first):
        assert rpcs["NodeGroupForNode"] >= SIZE + STATIC, rpcs
        assert (rpcs["NodeGroupForNode"] - SIZE) % STATIC == 0, rpcs
    assert steady.get("NodeGroupTemplateNodeInfo", 0) < SIZE, steady
    assert row["steady"]["rpcs_total"] == pytest.approx(sum(steady.values()))


def test_the_command_line_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    cases = {
        ("--generations", "9.99"): "unknown 9.99",
        ("--sizes", "1000,zero"): "'zero' is not a positive whole number",
        ("--loops", "0"): "--loops must be at least 1, got 0",
        ("--smoke",): "--smoke applies to --workload default only, not to real-ca",
        ("--nodes", "1000"): "--nodes applies to --workload node-memory only, not to real-ca",
    }
    for args, message in cases.items():
        done = bench("--workload", "real-ca", *args, "--out", str(tmp_path))
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    elsewhere = {
        ("--sizes", "1000"): "--sizes applies to --workload real-ca only, not to default",
        ("--workload", "node-memory", "--nodes", "1,2"): "--nodes takes one number",
        ("--workload", "node-memory", "--generations", "1.36.1"): "--generations applies to "
        "--workload real-ca only, not to node-memory",
        ("--workload", "node-memory", "--scan-interval", "0"): "--scan-interval must be at "
        "least 1, got 0",
    }
    for args, message in elsewhere.items():
        done = bench(*args, "--out", str(tmp_path))
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def test_results_md_keeps_the_other_runs_part(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    real_ca, memory = resultsmd.REAL_CA_HEADING, resultsmd.NODE_MEMORY_HEADING
    resultsmd.write_main(path, "# Benchmark results\n\nfull run 1\n")
    resultsmd.write_section(path, f"{memory}\n\nmemory 1\n")
    assert path.read_text() == f"# Benchmark results\n\nfull run 1\n\n{memory}\n\nmemory 1\n"
    resultsmd.write_section(path, f"{real_ca}\n\nreal CA 1\n")
    both = f"{real_ca}\n\nreal CA 1\n\n{memory}\n\nmemory 1\n"
    assert path.read_text() == f"# Benchmark results\n\nfull run 1\n\n{both}"
    resultsmd.write_main(path, "# Benchmark results\n\nfull run 2\n")
    assert path.read_text() == f"# Benchmark results\n\nfull run 2\n\n{both}"
    resultsmd.write_section(path, f"{real_ca}\n\nreal CA 2\n")
    both = f"{real_ca}\n\nreal CA 2\n\n{memory}\n\nmemory 1\n"
    assert path.read_text() == f"# Benchmark results\n\nfull run 2\n\n{both}"
    with pytest.raises(ValueError, match="not '## Something else'"):
        resultsmd.write_section(path, "## Something else\n")
