"""Check a Grafana dashboard: valid JSON, and every metric its queries name is one that exists.

``batchstream_*`` names must be exported by the code (a prometheus_client Counter, Gauge,
Histogram or Summary defined under services/ or shared/, with the suffixes the client adds);
names from other exporters must be listed in ``EXTERNAL_METRICS``. A renamed metric then fails
``make check-deploy`` instead of leaving an empty panel. Standard library only::

    python deploy/check_dashboard.py deploy/grafana/dashboards/batchstream.json
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("services", "shared")

# Metrics the dashboard reads from exporters other than batchstream's code.
EXTERNAL_METRICS = {
    # danielqsj/kafka-exporter (docker-compose.yml): consumer lag per topic and group.
    "kafka_consumergroup_lag",
    # vLLM's Prometheus stat logger (vllm/v1/metrics/loggers.py, vLLM 0.32), in the worker's registry.
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
}
_DEFINITION = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"")
_METRIC_REF = re.compile(r"(?<![\w:$\"])((?:batchstream_|vllm:|kafka_)[a-zA-Z0-9_:]*)")
_SUFFIXES = {
    "Counter": ("_total", "_created"),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("_sum", "_count", "_created"),
}


def exported_metrics(root: Path = ROOT) -> set[str]:
    """Every series name the code's prometheus_client metrics export."""
    names: set[str] = set()
    for source in SOURCES:
        for path in sorted((root / source).rglob("*.py")):
            for kind, name in _DEFINITION.findall(path.read_text()):
                if kind == "Counter":
                    name = name.removesuffix("_total")
                names.update(name + suffix for suffix in _SUFFIXES[kind])
    return names


def queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) for every target of every panel, rows included."""
    stack = list(dashboard.get("panels", []))
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel.get("title", "?"), target["expr"]


def problems(dashboard_path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the dashboard; empty when it is fine."""
    try:
        dashboard = json.loads(dashboard_path.read_text())
    except json.JSONDecodeError as exc:
        return [f"{dashboard_path}: not JSON: {exc}"]
    known = exported_metrics(root) | EXTERNAL_METRICS
    found: list[str] = []
    seen_any = False
    for title, expr in queries(dashboard):
        refs = _METRIC_REF.findall(expr)
        if not refs:
            found.append(f"panel {title!r}: no known metric in {expr!r}")
        for name in refs:
            seen_any = True
            if name not in known:
                found.append(f"panel {title!r}: unknown metric {name}")
    if not seen_any:
        found.append(f"{dashboard_path}: no queries")
    return found


def main(argv: list[str]) -> int:
    failures = [problem for path in argv for problem in problems(Path(path))]
    for problem in failures:
        print(problem, file=sys.stderr)
    if not failures:
        print(f"dashboards ok: {', '.join(argv)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
