"""The node-memory workload's parts that need no real node (`python -m bench --workload
node-memory`, bench/README.md; its run on a real node writes bench/RESULTS.md): the cgroup and
/proc figures read for a process of this host, and the report's verdicts on the chart's
request and limit, table-tested."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # bench is a top-level package of the repository

from bench.nodememory import report, sample  # noqa: E402

MIB = 1024 * 1024


def test_a_process_of_this_host_reads_as_a_container_would() -> None:
    """The same files the workload reads for a provider's container, for this test's own
    process: its memory cgroup's usage, working set, peak and limit, and its /proc status."""
    cgroup, v1 = sample._memory_cgroup(os.getpid())
    assert cgroup.is_dir(), cgroup
    container = sample.Container("this-test", os.getpid(), cgroup, v1)
    figures = sample.sample(container, {"this-test": 123})
    assert 0 < figures.working_set <= figures.usage <= figures.peak <= figures.limit, figures
    assert figures.kubelet_working_set == 123
    assert figures.rss_anon > MIB and figures.rss_anon + figures.rss_file <= figures.rss
    assert figures.rss <= figures.hwm


@pytest.mark.parametrize(
    ("text", "expected"),
    [("128Mi", 128 * MIB), ("1Gi", 1024 * MIB), ("512Ki", 512 * 1024), ("500000000", 500000000),
     ("1.5Gi", 1536 * MIB)],
)  # fmt: skip
def test_quantities(text: str, expected: int) -> None:
    assert report.quantity(text) == expected


def _sample(role: str, working_set_mib: int, limit_mib: int = 384) -> dict[str, Any]:
    working = working_set_mib * MIB
    return {"pod": role, "role": role, "working_set": working, "usage": working,
            "peak": working, "limit": limit_mib * MIB, "kubelet_working_set": None,
            "rss": working, "rss_anon": working, "rss_file": 0, "hwm": working}  # fmt: skip


def _result(idle_mib: int, loaded_mib: int, limit_mib: int = 384) -> dict[str, Any]:
    standby = _sample("standby", 70, limit_mib)
    return {
        "resources": {"requests": {"memory": "128Mi"}, "limits": {"memory": "384Mi"}},
        "phases": {
            "idle": {"samples": [_sample("leader", idle_mib, limit_mib), standby]},
            "ca": {"samples": [_sample("leader", loaded_mib, limit_mib), standby]},
        },
    }


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (_result(78, 83), ["limit is 384 MiB, `limits.memory` 384Mi (384 MiB): yes.",
                           "83 MiB, is 22 % of the limit",
                           "at idle, at most 78 MiB, is within `requests.memory` 128Mi (61 %)",
                           "loop, at most 83 MiB, is within `requests.memory` 128Mi (65 %)"]),
        (_result(100, 200), ["200 MiB, is 52 % of the limit",
                             "loop, at most 200 MiB, is ABOVE `requests.memory` 128Mi (156 %)"]),
        (_result(78, 83, limit_mib=1024), ["limit is 1024 MiB, `limits.memory` 384Mi "
                                            "(384 MiB): NO."]),
    ],
)  # fmt: skip
def test_verdicts_hold_the_chart_to_the_figures(
    result: dict[str, Any], expected: list[str]
) -> None:
    text = "\n".join(report.verdicts(result))
    for phrase in expected:
        assert phrase in text, text


def test_the_table_has_a_row_per_phase_and_replica() -> None:
    rows = report.table(_result(78, 83))
    assert len(rows) == 2 + 4
    assert rows[2].startswith("| idle (both Ready, no CA) | leader | 1 | 78 | 78 | - |")
    assert rows[5].startswith("| under CA's loop | standby | 1 | 70 |")
