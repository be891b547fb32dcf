"""The markdown of a real-CA run: the "Real Cluster Autoscaler" section of bench/RESULTS.md."""

from __future__ import annotations

from typing import Any

from bench.report import MB, ms, run_line, table
from bench.resultsmd import REAL_CA_HEADING

# The RPCs an idle loop makes, in the order CA makes them; any other method follows.
METHOD_ORDER = (
    "Refresh",
    "NodeGroups",
    "NodeGroupForNode",
    "NodeGroupTargetSize",
    "NodeGroupGetOptions",
    "NodeGroupTemplateNodeInfo",
    "NodeGroupNodes",
)


def _calls(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _methods(rows: list[dict[str, Any]]) -> list[str]:
    seen = {m for row in rows for part in ("first_loop", "steady") for m in row[part]["rpcs"]}
    return [m for m in METHOD_ORDER if m in seen] + sorted(seen - set(METHOD_ORDER))


def _main_row(row: dict[str, Any]) -> list[str]:
    steady, first = row["steady"], row["first_loop"]
    return [
        row["generation"],
        f"{row['size']:,}",
        f"{row['nodes']:,}",
        ms(steady["ca_main_s"]),
        ms(steady["ca_cloud_provider_refresh_s"]),
        ms(steady["our_refresh_s"]),
        _calls(steady["rpcs_total"]),
        ms(steady["server_cpu_s"]),
        ms(steady["ca_cpu_s"]),
        ms(steady["emulator_cpu_s"]),
        ms(first["ca_main_s"]),
        ms(first["wall_s"]),
        _calls(first["rpcs"].get("NodeGroupTemplateNodeInfo", 0.0)),
        _calls(first["rpcs_total"]),
        ms(first["server_cpu_s"]),
        ms(first["ca_cpu_s"]),
        f"{row['server_rss_bytes'] / MB:.0f}",
        f"{row['ca_rss_bytes'] / MB:.0f}",
    ]


def _not_ok(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        for method, codes in row["not_ok"].items():
            answered = ", ".join(f"{code} {_calls(n)}" for code, n in codes.items())
            lines.append(f"- CA {row['generation']}, N={row['size']:,}: {method}: {answered}")
    if not lines:
        return ["Our server answered every call with OK.", ""]
    return ["Calls our server answered with another code than OK (whole run):", "", *lines, ""]


MAIN_HEADER = [
    "CA", "N", "nodes", "CA loop (main)", "CA cloudProviderRefresh", "our Refresh", "RPCs/loop",
    "our CPU/loop", "CA CPU/loop", "emulator CPU/loop", "first loop: CA main",
    "its end after CA's start", "TemplateNodeInfo", "RPCs", "our CPU", "CA CPU", "our RSS MB",
    "CA RSS MB",
]  # fmt: skip


def _by_method(rows: list[dict[str, Any]]) -> list[str]:
    methods = _methods(rows)
    return table(
        ["CA", "N", *methods],
        [
            [
                row["generation"],
                f"{row['size']:,}",
                *(
                    f"{_calls(row['steady']['rpcs'].get(m, 0.0))} "
                    f"({_calls(row['first_loop']['rpcs'].get(m, 0.0))})"
                    for m in methods
                ),
            ]
            for row in rows
        ],
    )


def markdown(report: dict[str, Any]) -> str:
    rows = report["results"]
    plan = report["plan"]
    lines = [
        REAL_CA_HEADING,
        "",
        run_line(report),
        "",
        "The real Cluster Autoscaler binary of each generation (built from upstream's sources "
        "with `-tags externalgrpc`, tests/fixtures/autoscaler.py) on a loopback kube-apiserver, "
        "calling our server over mTLS. The emulator holds N servers of ours in one group "
        "(minSize = N: nothing to scale down), N/2 of another cluster and max(10, N/10) "
        "untagged ones; Kubernetes has a Ready Node for each of ours and each untagged one "
        "(nodes). CA flags besides the addresses: "
        f"`{' '.join(report['ca_flags'])}`. Steady: the mean of {plan['steady_loops']} loops "
        "after the first; CPU is the process's from the end of one loop to the end of the "
        "next (the scan interval's wait included). First loop: from CA's start (its first "
        "listing of the cluster included) to the end of its first loop. Times in ms.",
        "",
        *table(MAIN_HEADER, [_main_row(row) for row in rows]),
        "",
        "### RPCs per loop by method (steady; the first loop in brackets)",
        "",
        *_by_method(rows),
        "",
        *_not_ok(rows),
    ]
    return "\n".join(lines)
