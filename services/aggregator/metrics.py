"""Prometheus metrics of the aggregator (the default registry, served at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Enum, Gauge, Histogram

RESULTS_PROCESSED = Counter(
    "batchstream_aggregator_results_processed_total",
    "Result lines counted for the first time, by outcome.",
    ["outcome"],
)
DUPLICATES_DROPPED = Counter(
    "batchstream_aggregator_duplicates_dropped_total", "Result lines already counted."
)
LATE_RESULTS_DROPPED = Counter(
    "batchstream_aggregator_late_results_dropped_total",
    "Results for batches already terminal.",
)
INVALID_RESULTS = Counter(
    "batchstream_aggregator_invalid_results_total",
    "Results that could not be used, by reason.",
    ["reason"],
)
CHUNKS_WRITTEN = Counter("batchstream_aggregator_chunks_written_total", "Result chunk objects written.")
BATCHES_FINALIZED = Counter(
    "batchstream_aggregator_batches_finalized_total",
    "Batches moved to a terminal status, by status.",
    ["status"],
)
COUNT_UPDATES = Counter(
    "batchstream_aggregator_count_updates_total", "Batch documents updated with live counts."
)
# Where a live count's lag goes (the pipeline benchmark prints these): a result's age, from its
# Kafka timestamp, when the agent's poll took it and when its chunk's processing began; and how
# long a chunk takes from there until its counts are in MongoDB. Observed per poll and per chunk
# (the chunk's oldest and newest result), never per line.
_AGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
RESULT_AGE = Histogram(
    "batchstream_aggregator_result_age_seconds",
    "Age of the oldest and newest result of each poll (stage=polled) and of each chunk as its "
    "processing begins (stage=chunk_started), from the result's Kafka timestamp.",
    ["stage", "end"],
    buckets=_AGE_BUCKETS,
)
CHUNK_SECONDS = Histogram(
    "batchstream_aggregator_chunk_seconds",
    "A chunk from the start of its processing until its counts are in MongoDB (stored, counted, "
    "acked, counts flushed).",
    buckets=_AGE_BUCKETS,
)
FINALIZE_SECONDS = Histogram(
    "batchstream_aggregator_finalize_seconds", "Time to merge and register a batch's files."
)
STALLS = Counter(
    "batchstream_aggregator_stalls_total",
    "Times the watchdog found results waiting and none processed (the worker then exits).",
)
PHASE = Enum(
    "batchstream_aggregator_phase",
    "What the worker is doing, as the stall watchdog last saw it (supervisor.py).",
    states=["unassigned", "rebalancing", "recovering", "processing"],
)
REWINDS = Counter(
    "batchstream_aggregator_offset_rewinds_total",
    "Times a results partition was fetched again from its committed offset because faust had "
    "dropped offsets it would never deliver (offset_gaps.py).",
)
WEBHOOK_DELIVERIES = Counter(
    "batchstream_webhook_deliveries_total",
    "Webhook events settled, by outcome: delivered (a 2xx), failed (given up after the retry "
    "window); retry counts attempts that will be made again.",
    ["outcome"],
)
WEBHOOK_ATTEMPTS = Counter("batchstream_webhook_attempts_total", "Webhook delivery attempts sent.")
WEBHOOK_QUEUE = Gauge(
    "batchstream_webhook_queue_size", "Webhook events pending (not yet delivered nor given up)."
)
