"""The figures a person would rather see than read: SVG plots of a bench run's results.

`loop.svg`: the CA loop's wall time and our CPU per loop against N, ours beside the Go
reference, one line per CA generation's pattern and number of groups G. `latency.svg`: the
single RPCs CA makes per node, mean and p99 per call and CPU per call, ours beside the Go
reference and the Python floor. The SVGs keep their text as text and carry no date, so a rerun
with the same figures writes the same bytes and a diff of bench/ shows only what changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# Fixed ids and no timestamp: the same figures give the same file.
plt.rcParams["svg.hashsalt"] = "cloudscale-autoscaler-bench"
plt.rcParams["svg.fonttype"] = "none"

PLOTS = ("loop.svg", "latency.svg")
SERVERS = (("ours", "ours"), ("goref", "Go reference"), ("pyref", "Python floor"))


def draw(report: dict[str, Any], out: Path) -> list[Path]:
    """Write every plot of `report` into `out`; returns their paths, in PLOTS' order."""
    results = report["results"]
    paths = [out / name for name in PLOTS]
    _loop(results["ca_loop"], paths[0])
    _latency(results["single_rpcs"], paths[1])
    return paths


def _loop(rows: list[dict[str, Any]], path: Path) -> None:
    fig, (wall, cpu) = plt.subplots(1, 2, figsize=(10, 4))
    for pattern, groups in dict.fromkeys((row["pattern"], row["groups"]) for row in rows):
        mine = sorted(
            (r for r in rows if (r["pattern"], r["groups"]) == (pattern, groups)),
            key=lambda r: r["size"],
        )
        sizes = [r["size"] for r in mine]
        series = f"{pattern}, G={groups}"
        for axis, key in ((wall, "loop_mean_s"), (cpu, "provider_cpu_per_loop_s")):
            line = axis.plot(sizes, [r["ours"][key] for r in mine], marker="o", label=series)
            axis.plot(
                sizes,
                [r["goref"][key] for r in mine],
                marker="x",
                linestyle="--",
                color=line[0].get_color(),
                label=f"{series}, Go reference",
            )
    wall.set_title("CA loop: wall time")
    wall.set_ylabel("seconds per loop")
    cpu.set_title("CA loop: provider CPU")
    cpu.set_ylabel("CPU seconds per loop")
    for axis in (wall, cpu):
        axis.set_xlabel("servers (N)")
        _log_axes(axis, rows)
        axis.legend(fontsize="small")
    _save(fig, path)


def _latency(rows: list[dict[str, Any]], path: Path) -> None:
    fig, (latency, cpu) = plt.subplots(1, 2, figsize=(10, 4))
    names = [row["rpc"] for row in rows]
    width = 0.8 / len(SERVERS)
    for i, (key, label) in enumerate(SERVERS):
        at = [n + (i - (len(SERVERS) - 1) / 2) * width for n in range(len(rows))]
        means = [row[key]["mean_us"] for row in rows]
        bars = latency.barh(at, means, height=width, label=f"{label} (mean)")
        latency.plot(
            [row[key]["p99_us"] for row in rows],
            at,
            linestyle="none",
            marker="|",
            markersize=10,
            color=bars.patches[0].get_facecolor(),
            label=f"{label} (p99)",
        )
        cpu.barh(at, [row[key]["cpu_per_call_us"] for row in rows], height=width, label=label)
    latency.set_title("Single RPCs: time per call")
    latency.set_xlabel("µs per call")
    cpu.set_title("Single RPCs: server CPU per call")
    cpu.set_xlabel("CPU µs per call")
    for axis in (latency, cpu):
        axis.set_yticks(range(len(rows)), names)
        axis.invert_yaxis()
        axis.legend(fontsize="small", loc="lower right")
        axis.grid(True, axis="x", alpha=0.3)
    cpu.tick_params(labelleft=False)
    _save(fig, path)


def _log_axes(axis: Any, rows: list[dict[str, Any]]) -> None:
    """Log scales when N spans more than one size (a smoke run has one)."""
    if len({row["size"] for row in rows}) > 1:
        axis.set_xscale("log")
        axis.set_yscale("log")
    axis.grid(True, which="both", alpha=0.3)


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
