"""One value from a Prometheus ``/metrics`` page (``deploy.local.probes``, which the benchmarks
read too)."""

from deploy.local.probes import metric_value, metric_values, metrics_text

__all__ = ["metric_value", "metric_values", "metrics_text"]
