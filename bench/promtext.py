"""Prometheus /metrics endpoints read over HTTP: our server's and the Cluster Autoscaler's."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT = 30.0


@dataclass(frozen=True)
class Sample:
    name: str  # the sample's own name: "x_total", "x_sum", "x_count", ...
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Scrape:
    """Every sample of one scrape."""

    samples: list[Sample]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` whose labels include `labels` (0 if none:
        a labelled series appears only once it has been observed)."""
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def by_label(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """The samples called `name` (with `labels`) summed per value of `label`."""
        out: dict[str, float] = {}
        for s in self.samples:
            if s.name != name or label not in s.labels:
                continue
            if all(s.labels.get(k) == v for k, v in labels.items()):
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
        return out


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
        text = response.read().decode()
    samples = [
        Sample(s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    return Scrape(samples)
