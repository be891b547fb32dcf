"""The node-memory run as a RESULTS.md section: each replica's container at idle and under CA's
loop, its cgroup and the kubelet's figures beside the process's RSS, and the chart's
requests and limits against them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.report import run_line
from bench.resultsmd import NODE_MEMORY_HEADING

MIB = 1024 * 1024
UNITS = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}


def quantity(text: str) -> int:
    """A Kubernetes memory quantity in bytes: 128Mi, 1Gi, 500000000."""
    for suffix, factor in UNITS.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def _rows(samples: Sequence[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [s for s in samples if s["role"] == role]


def summary(samples: Sequence[dict[str, Any]], role: str) -> dict[str, float | None]:
    """The highest of each figure over a phase's samples of `role` (mean of the working set)."""
    rows = _rows(samples, role)
    if not rows:
        return {}
    kubelet = [s["kubelet_working_set"] for s in rows if s["kubelet_working_set"] is not None]
    return {
        "samples": len(rows),
        "working_set_mean": sum(s["working_set"] for s in rows) / len(rows),
        "working_set_max": max(s["working_set"] for s in rows),
        "kubelet_working_set_max": max(kubelet) if kubelet else None,
        "usage_max": max(s["usage"] for s in rows),
        "peak": max(s["peak"] for s in rows),
        "rss_max": max(s["rss"] for s in rows),
        "rss_anon_max": max(s["rss_anon"] for s in rows),
        "rss_file_max": max(s["rss_file"] for s in rows),
        "hwm": max(s["hwm"] for s in rows),
        "limit": min(s["limit"] for s in rows),
    }


PHASES = {"idle": "idle (both Ready, no CA)", "ca": "under CA's loop"}
COLUMNS = ("phase", "replica", "samples", "working set mean", "working set max",
           "kubelet working set max", "cgroup usage max", "cgroup peak", "RSS max",
           "RssAnon max", "RssFile+RssShmem max", "VmHWM", "cgroup limit")  # fmt: skip


def table(result: dict[str, Any]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for phase, label in PHASES.items():
        for role in ("leader", "standby"):
            figures = summary(result["phases"][phase]["samples"], role)
            if not figures:
                continue
            cells = [label, role, str(figures["samples"]),
                     *(_mib(figures[k]) for k in ("working_set_mean", "working_set_max",
                                                  "kubelet_working_set_max", "usage_max", "peak",
                                                  "rss_max", "rss_anon_max", "rss_file_max",
                                                  "hwm", "limit"))]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def verdicts(result: dict[str, Any]) -> list[str]:
    """The chart's request and limit against the figures."""
    request = quantity(result["resources"]["requests"]["memory"])
    limit = quantity(result["resources"]["limits"]["memory"])
    every = [s for phase in result["phases"].values() for s in phase["samples"]]
    idle = summary(result["phases"]["idle"]["samples"], "leader")
    loaded = summary(result["phases"]["ca"]["samples"], "leader")
    enforced = {s["limit"] for s in every}
    peak = max(s["peak"] for s in every)
    lines = [
        f"- The kernel enforces the chart's limit: every sample's cgroup limit is "
        f"{', '.join(_mib(v) for v in sorted(enforced))} MiB, `limits.memory` "
        f"{result['resources']['limits']['memory']} ({_mib(limit)} MiB): "
        f"{'yes' if enforced == {limit} else 'NO'}.",
        f"- The highest cgroup peak of either replica, {_mib(peak)} MiB, is "
        f"{100 * peak / limit:.0f} % of the limit.",
    ]
    for name, figures in (("at idle", idle), ("under CA's loop", loaded)):
        working = figures["working_set_max"]
        assert working is not None
        side = "within" if working <= request else "ABOVE"
        lines.append(
            f"- The leader's working set {name}, at most {_mib(working)} MiB, is {side} "
            f"`requests.memory` {result['resources']['requests']['memory']} "
            f"({100 * working / request:.0f} %)."
        )
    return lines


def _counts(by_name: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:,.0f}" for name, value in sorted(by_name.items()))


def markdown(result: dict[str, Any]) -> str:
    plan, ca = result["plan"], result["phases"]["ca"]
    lines = [
        NODE_MEMORY_HEADING,
        "",
        run_line(result),
        "",
        f"The chart installed with `helm install --wait` ({result['install_s']:.1f} s) on a "
        f"real kubelet (two replicas, the chart's defaults), sampled every "
        f"{plan['sample_period_s']:.0f} s: "
        f"{plan['idle_seconds']:.0f} s with both replicas Ready and no CA, then CA "
        f"{plan['ca_version']} (--scan-interval={plan['scan_interval_s']}s) calling the "
        f"leader through the gRPC Service's ClusterIP with {plan['nodes']:,} Ready kwok Nodes "
        f"of the group, from the end of its first loop ({ca['first_loop_s']:.0f} s after its "
        f"start) to the end of {plan['loops']} more: {ca['our_rpcs']:,.0f} RPCs answered, "
        f"CA's nodes by state {_counts(ca['ca_nodes'])}, CA's errors "
        f"{_counts(ca['ca_errors']) or 'none'}.",
        "",
        "MiB (2^20 bytes). Working set: the cgroup's usage less its inactive file pages, as "
        "the kubelet computes it (its own figure from the summary API beside it, refreshed "
        "every 10-15 s); cgroup peak: the cgroup's high-water mark since the container "
        "started; RSS (anonymous and file-backed apart) and VmHWM: the provider process's "
        "/proc status. RSS can exceed the working set by its mapped files (the interpreter, "
        "the libraries, the compiled transport): the kernel charges such a page once, to "
        "the cgroup that first brought it in (for the image's files, the import on the host "
        "that wrote them), while every process that maps it counts it in its RSS; the "
        "anonymous part is each process's own. The test node's containerd keeps the "
        "image's files on a tmpfs, so they count as RssShmem there, as RssFile on a disk.",
        "",
        *table(result),
        "",
        *verdicts(result),
    ]
    return "\n".join(lines) + "\n"
