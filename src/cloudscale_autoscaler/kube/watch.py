"""The periodic drift check of a serving provider: metrics and one warning per group and field.

Gauges (read at scrape time from the last check):
- cloudscale_autoscaler_template_drift_ratio{group,resource}: (live - template) / template of
  the node that differs most, per compared resource ("allocatable.memory", "capacity.cpu",
  ...); negative = the nodes have less than the template promises. Capacity is informational:
  real nodes report a little less than the flavor, and only allocatable differences warn.
- cloudscale_autoscaler_template_drift_nodes{group,kind}: nodes differing beyond tolerance in
  resources, labels or taints.
- cloudscale_autoscaler_template_drift_checked_nodes{group}: nodes compared.
- cloudscale_autoscaler_template_drift_last_check_timestamp_seconds: last successful check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cloudscale_autoscaler.engine.engine import Engine
from cloudscale_autoscaler.kube.api import KubeApi, KubeError
from cloudscale_autoscaler.kube.check import DriftReport, check
from cloudscale_autoscaler.kube.drift import KINDS, GroupDrift, warning_line
from cloudscale_autoscaler.observability.metrics import NAMESPACE
from cloudscale_autoscaler.settings.types import Config

log = logging.getLogger(__name__)


class DriftWatch(Collector):
    def __init__(
        self,
        config: Config,
        engine: Engine,
        api: KubeApi,
        tolerance: float,
        on_drift: Callable[[GroupDrift], None],
    ) -> None:
        """`on_drift` is told each group and field found drifting (as warned), each check."""
        self._config = config
        self._engine = engine
        self._api = api
        self._tolerance = tolerance
        self._on_drift = on_drift
        self.report: DriftReport | None = None
        self.last_check_unix = 0.0

    def reconfigure(self, config: Config) -> None:
        self._config = config

    async def run(self, interval: float) -> None:
        """Check every `interval` seconds until cancelled; a failed check is logged."""
        while True:
            try:
                await self.check_once()
            except KubeError as exc:
                log.warning("template drift check: listing Nodes failed: %s", exc)
            except Exception:  # a Node we cannot read must not end the checks for good
                log.exception("template drift check failed")
            await asyncio.sleep(interval)

    async def check_once(self) -> DriftReport:
        # Nodes are mapped to groups through the inventory: load it if nothing has yet.
        if not self._engine.loaded:
            await self._engine.start()
        nodes = await self._api.list_nodes()
        report = await check(self._engine, self._config, nodes, self._tolerance)
        for group in report.groups:
            if group.problem:
                log.warning("template drift check: node group %s: %s", group.group, group.problem)
            for drift in group.drifts:
                log.warning(warning_line(drift))
                self._on_drift(drift)
        self.report = report
        self.last_check_unix = time.time()
        return report

    def collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(
            f"{NAMESPACE}_template_drift_ratio",
            "Relative difference (live - template) / template of the group's most differing "
            "node, per resource.",
            labels=["group", "resource"],
        )
        nodes = GaugeMetricFamily(
            f"{NAMESPACE}_template_drift_nodes",
            "Nodes of the group that differ from its template beyond tolerance, by kind.",
            labels=["group", "kind"],
        )
        checked = GaugeMetricFamily(
            f"{NAMESPACE}_template_drift_checked_nodes",
            "Nodes of the group compared with its template in the last check.",
            labels=["group"],
        )
        last = GaugeMetricFamily(
            f"{NAMESPACE}_template_drift_last_check_timestamp_seconds",
            "Unix time of the last completed template drift check.",
        )
        last.add_metric([], self.last_check_unix)
        for group in self.report.groups if self.report else []:
            checked.add_metric([group.group], float(group.nodes))
            for resource, (_, comparison) in sorted(group.worst.items()):
                ratio.add_metric([group.group, resource], comparison.ratio)
            for kind in KINDS:
                nodes.add_metric([group.group, kind], float(len(group.differing.get(kind, ()))))
        yield from (ratio, nodes, checked, last)
