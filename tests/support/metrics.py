"""One value from a Prometheus ``/metrics`` page, parsed by prometheus_client."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def metric_value(url: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels`` (0 when there is none)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text(url))
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )
