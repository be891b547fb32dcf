"""One drift check: live Nodes -> groups (providerID through the engine's inventory) ->
comparison with each group's template. Shared by the periodic check and `drift`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cloudscale_autoscaler.engine.engine import Engine
from cloudscale_autoscaler.engine.errors import EngineError
from cloudscale_autoscaler.kube.drift import (
    Difference,
    GroupDrift,
    ResourceComparison,
    compare_node,
    compare_resources,
    kind_of,
    settled,
    summarize,
)
from cloudscale_autoscaler.protos.k8s.api import core_v1_pb2
from cloudscale_autoscaler.settings.types import Config, with_entries
from cloudscale_autoscaler.template.render import node_to_dict

log = logging.getLogger(__name__)

Node = Mapping[str, Any]


@dataclass
class GroupReport:
    group: str
    nodes: int = 0
    # Per "field.resource": the comparison of the node that differs most, drifted or not.
    worst: dict[str, tuple[str, ResourceComparison]] = field(default_factory=dict)
    drifts: list[GroupDrift] = field(default_factory=list)
    # Names of the nodes differing beyond tolerance, per kind (resources, labels, taints).
    differing: dict[str, set[str]] = field(default_factory=dict)
    # Why the group could not be checked (its template could not be built), if so.
    problem: str | None = None


@dataclass
class DriftReport:
    groups: list[GroupReport]

    @property
    def drifted(self) -> bool:
        return any(group.drifts for group in self.groups)

    @property
    def failed_groups(self) -> list[str]:
        """The groups that could not be compared (their template could not be built)."""
        return [group.group for group in self.groups if group.problem]

    @property
    def failed(self) -> bool:
        return bool(self.failed_groups)


def node_name(node: Node) -> str:
    return str((node.get("metadata") or {}).get("name") or "?")


def provider_id(node: Node) -> str:
    return str((node.get("spec") or {}).get("providerID") or "")


def nodes_by_group(engine: Engine, nodes: Iterable[Node]) -> dict[str, list[Node]]:
    """Settled nodes whose providerID the inventory knows, by group; others are not ours,
    or still coming up."""
    grouped: dict[str, list[Node]] = {}
    for node in nodes:
        group = engine.node_group_for_node(provider_id(node)).nodeGroup.id
        if group and settled(node):
            grouped.setdefault(group, []).append(node)
    return grouped


async def template_of(engine: Engine, group: str) -> dict[str, Any]:
    response = await engine.template_node_info(group)
    return node_to_dict(core_v1_pb2.Node.FromString(response.nodeBytes))


async def check(
    engine: Engine, config: Config, nodes: Sequence[Node], tolerance: float
) -> DriftReport:
    grouped = nodes_by_group(engine, nodes)
    reports = []
    for index, group in with_entries(config.node_groups):
        report = GroupReport(group.name)
        reports.append(report)
        members = grouped.get(group.name, [])
        report.nodes = len(members)
        if not members:
            continue
        try:
            template = await template_of(engine, group.name)
        except EngineError as exc:
            report.problem = f"no template: {exc}"
            continue
        compared: list[tuple[str, Sequence[Difference]]] = []
        for node in members:
            name = node_name(node)
            differences = compare_node(template, node, tolerance)
            compared.append((name, differences))
            for difference in differences:
                report.differing.setdefault(kind_of(difference.field), set()).add(name)
            for comparison in compare_resources(template, node):
                seen = report.worst.get(comparison.field)
                if seen is None or abs(comparison.ratio) > abs(seen[1].ratio):
                    report.worst[comparison.field] = (name, comparison)
        report.drifts = summarize(group, index, compared)
    return DriftReport(reports)
