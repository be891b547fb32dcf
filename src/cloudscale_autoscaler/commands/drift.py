"""`cloudscale-autoscaler drift --config FILE [--kubeconfig FILE]`: compare each group's
template with its live Nodes and print the comparison as a table.

Nodes are mapped to groups the way the server does it: one listing of the cluster's servers
from the cloud, then each Node's providerID. Exit codes: 0 = no drift, 1 = drift, 2 = the
comparison could not be made (config, credentials, an API that does not answer).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from cloudscale_autoscaler.engine.errors import CloudUnavailable
from cloudscale_autoscaler.kube.check import DriftReport, GroupReport
from cloudscale_autoscaler.kube.drift import informational
from cloudscale_autoscaler.settings.types import Config, ConfigError, KubernetesConfig

EXIT_CLEAN = 0
EXIT_DRIFT = 1
EXIT_ERROR = 2
HEADER = ("GROUP", "NODES", "FIELD", "TEMPLATE", "LIVE", "NODE", "DIFF", "")


def drift_command(config_path: Path, kubeconfig: Path | None) -> int:
    from cloudscale_autoscaler.config.loader import load_config
    from cloudscale_autoscaler.kube.api import KubeConfigError, KubeError

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_ERROR
    try:
        report = asyncio.run(_compare(config, kubeconfig))
    except (KubeConfigError, KubeError, CloudUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    sys.stdout.write(render(report))
    return exit_code(report)


def exit_code(report: DriftReport) -> int:
    """A group not compared is an error even when the others drift: its verdict is unknown."""
    if report.failed:
        return EXIT_ERROR
    return EXIT_DRIFT if report.drifted else EXIT_CLEAN


async def _compare(config: Config, kubeconfig: Path | None) -> DriftReport:
    from cloudscale_autoscaler.cloud.client import CloudscaleClient
    from cloudscale_autoscaler.engine.engine import Engine
    from cloudscale_autoscaler.kube.api import KubeApi, load_client
    from cloudscale_autoscaler.kube.check import check

    settings = config.kubernetes or KubernetesConfig()
    chosen = kubeconfig or settings.kubeconfig
    api = KubeApi(await asyncio.to_thread(load_client, chosen, default_kubeconfig=True))
    client = CloudscaleClient.from_config(config.cloudscale)
    engine = Engine(config, client)
    try:
        await engine.refresh()
        nodes = await api.list_nodes()
        return await check(engine, config, nodes, settings.drift_tolerance)
    finally:
        await engine.aclose()
        await client.aclose()
        await asyncio.to_thread(api.close)


def _group_rows(group: GroupReport) -> list[tuple[str, ...]]:
    if group.problem:
        return [(group.group, str(group.nodes), group.problem, "", "", "", "", "ERROR")]
    if not group.nodes:
        return [(group.group, "0", "(no nodes to compare)", "", "", "", "", "")]
    drifted = {drift.field for drift in group.drifts}
    rows: list[tuple[str, ...]] = []
    for field, (node, comparison) in sorted(group.worst.items()):
        status = "info" if informational(field) else "DRIFT" if field in drifted else "ok"
        cells = (comparison.template, comparison.live, node, f"{comparison.ratio:+.1%}", status)
        rows.append((group.group, str(group.nodes), field, *cells))
    for drift in group.drifts:
        if drift.field not in group.worst:
            diff = drift.difference
            where = (group.group, str(group.nodes), drift.field)
            rows.append((*where, diff.template, diff.live, drift.node, "", "DRIFT"))
    return rows


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             for row in rows]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render(report: DriftReport) -> str:
    rows: list[tuple[str, ...]] = [HEADER]
    for group in report.groups:
        rows += _group_rows(group)
    out = _table(rows)
    advice = [
        f"  {drift.group} {drift.field}: {drift.advice} "
        f"({drift.nodes_differing} of {drift.nodes_compared} nodes differ)"
        for group in report.groups
        for drift in group.drifts
    ]
    if any(informational(field) for group in report.groups for field in group.worst):
        out += (
            "\ninfo: capacity is shown for information (a node reports a little less than its "
            "flavor); only allocatable, labels and taints count as drift.\n"
        )
    if advice:
        out += "\nWhat to change:\n" + "\n".join(advice) + "\n"
    failed = report.failed_groups
    if failed:
        out += (
            f"\nError: node group(s) {', '.join(failed)} not compared: their template could not "
            "be built (see the ERROR rows).\n"
        )
    elif not advice:
        out += "\nNo drift: every compared node matches its group's template.\n"
    return out
