"""The live count's lag: per result on the topic, until the batch document's count covered it,
and its parts from the aggregator's histograms (two scrapes of its /metrics)."""

from __future__ import annotations

import bisect
import collections
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from bench.common import percentile
from deploy.local import Stack

LAG_STAGES = {
    # name in the output: the aggregator's histogram and labels (services/aggregator/metrics.py)
    "polled_oldest": ("batchstream_aggregator_result_age_seconds", ("polled", "oldest")),
    "polled_newest": ("batchstream_aggregator_result_age_seconds", ("polled", "newest")),
    "chunk_started_oldest": ("batchstream_aggregator_result_age_seconds", ("chunk_started", "oldest")),
    "chunk_started_newest": ("batchstream_aggregator_result_age_seconds", ("chunk_started", "newest")),
    "chunk_processing": ("batchstream_aggregator_chunk_seconds", ()),
}


def aggregator_lag_sums(stack: Stack) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of the aggregator's lag histograms, scraped from its /metrics."""
    url = f"http://127.0.0.1:{stack.ports.aggregator}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found: dict[tuple[str, tuple[str, ...]], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sample.labels[k] for k in ("stage", "end") if k in sample.labels)
            for suffix, index in (("_sum", 0), ("_count", 1)):
                if sample.name.endswith(suffix):
                    found[(sample.name.removesuffix(suffix), labels)][index] += sample.value
    return {name: tuple(found.get(key, [0.0, 0.0])) for name, key in LAG_STAGES.items()}  # type: ignore[misc]


def lag_breakdown(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Mean of each lag histogram over the big batch (the difference of two scrapes)."""
    means = {}
    for name in LAG_STAGES:
        total, count = (a - b for a, b in zip(after[name], before[name], strict=True))
        means[name] = total / count if count else float("nan")
    return means


def count_lag(results: list[float], counts: list[tuple[float, int]]) -> dict[str, float]:
    """Per result k (in time order): when the document's count first reached k, minus its time."""
    if not results or not counts:
        return {}
    seen_values = [c for _, c in counts]
    lags = []
    for k in range(1, len(results) + 1):
        i = bisect.bisect_left(seen_values, k)  # counts only grow
        if i < len(counts):
            lags.append(counts[i][0] - results[k - 1])
    return {
        "p50": percentile(lags, 50),
        "p95": percentile(lags, 95),
        "max": max(lags) if lags else float("nan"),
        "poll_interval": 0.05,
    }
