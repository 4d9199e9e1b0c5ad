"""The dispatcher's Prometheus metrics (served on the api's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

QUEUED_LINES = Gauge(
    "batchstream_dispatch_queued_lines",
    "Request lines waiting in object storage to be dispatched",
    ["model", "project"],
)
DISPATCHED = Counter(
    "batchstream_dispatch_lines_total", "Request lines dispatched to a requests topic", ["model"]
)
RESENT = Counter(
    "batchstream_dispatch_lines_resent_total",
    "Lines sent again because their result never reached the aggregator",
    ["model"],
)
LOST = Counter(
    "batchstream_dispatch_lines_lost_total",
    "Lines given up after the last attempt (a line_lost error line)",
    ["model"],
)
UNDELIVERABLE = Counter(
    "batchstream_dispatch_lines_undeliverable_total",
    "Lines refused for good by the producer or the broker (a line_undeliverable error line)",
    ["model"],
)
ROUNDS = Counter(
    "batchstream_dispatch_rounds_total",
    "Dispatch rounds run (an idle replica runs about one per refresh_seconds)",
)
TOPIC_BACKLOG = Gauge(
    "batchstream_dispatch_topic_backlog", "Lines in the requests topic not committed by the group", ["model"]
)
TARGET_BACKLOG = Gauge(
    "batchstream_dispatch_target_backlog", "The backlog the dispatcher keeps the topic at", ["model"]
)
LEADER = Gauge(
    "batchstream_dispatch_leader", "1 while this replica holds the model's dispatch lease", ["model"]
)
