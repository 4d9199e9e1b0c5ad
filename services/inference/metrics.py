"""Prometheus metrics of the inference worker (served on /metrics by ``health``).

The counts every line moves (``REQUESTS``, ``STARTED``, the token counters) are kept in ``LINES``
as plain integers and added to their counters by ``flush``, which ``/metrics`` calls before it
answers: a scrape sees every line counted, as before. A prometheus ``inc`` takes a lock and walks
three calls; with the two in-flight gauge sets they were ~5% of the fake-engine worker's CPU per line
(py-spy), so the gauges are read at each scrape.
"""

from __future__ import annotations

import collections
import functools
from typing import get_args

from prometheus_client import Counter, Gauge, Histogram

from shared.protocol.messages import DeadLetterReason

REQUESTS = Counter(
    "batchstream_inference_requests_total",
    "Request messages processed, by outcome (HTTP-like status, or the never-ran error code).",
    ["status"],
)


@functools.cache
def requests_with(status: str) -> Counter:
    """``REQUESTS`` for one status, looked up once (``labels`` takes a lock and builds a key
    per call, a few percent of the worker's CPU per line with the instant engine)."""
    return REQUESTS.labels(status=status)


STARTED = Counter(
    "batchstream_inference_started_total",
    "Requests handed to the engine (lines answered without running are not counted).",
)
IN_FLIGHT = Gauge(
    "batchstream_inference_in_flight",
    "Requests the worker holds: running on the engine, or waiting for a place on it.",
)
WAITING_FOR_PLACE = Gauge(
    "batchstream_inference_waiting_for_place", "Requests in the worker waiting for a place on the engine."
)
PROMPT_TOKENS = Counter("batchstream_inference_prompt_tokens_total", "Prompt tokens processed.")
GENERATED_TOKENS = Counter("batchstream_inference_generated_tokens_total", "Completion tokens generated.")
SKIPPED = Counter(
    "batchstream_inference_skipped_messages_total", "Messages that were not valid request messages."
)
DEAD_LETTERS = Counter(
    "batchstream_inference_dead_letters_total",
    "Request messages put on the dead-letter topic (not run, or their reply refused), by reason.",
    ["reason"],
)
for _reason in get_args(DeadLetterReason):  # each reason shows from the start, at 0
    DEAD_LETTERS.labels(reason=_reason)
ENGINE_RETRIES = Counter(
    "batchstream_inference_engine_retries_total",
    "Engine calls tried again after a failure that may pass (a 5xx answer, or an exception).",
    ["reason"],
)
ENGINE_GAVE_UP = Counter(
    "batchstream_inference_engine_gave_up_total",
    "Lines that still failed after every try: they become 5xx error lines.",
)
PREEMPTED = Counter(
    "batchstream_inference_preempted_total",
    "Requests aborted to make room for a new batch's young lines; each runs again.",
)
PUBLISH_RETRIES = Counter(
    "batchstream_inference_publish_retries_total",
    "Result publishes tried again after the broker refused or did not confirm one.",
)
PUBLISH_FAILURES = Counter(
    "batchstream_inference_publish_failures_total",
    "Results whose every publish try failed: the worker stops and the line is not committed.",
)
RESULTS_PER_MESSAGE = Histogram(
    "batchstream_inference_results_per_message",
    "Results per published Kafka message (a batch's results that finish together travel as one).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)


class LineCounts:
    """What lines added to ``REQUESTS``, ``STARTED`` and the token counters since the last
    ``flush`` (single-threaded: the worker's event loop is its only writer and ``/metrics`` runs
    on it too)."""

    def __init__(self) -> None:
        self.by_status: collections.Counter[str] = collections.Counter()
        self.started = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0

    def flush(self) -> None:
        """Add the pending counts to the prometheus counters."""
        for status, count in self.by_status.items():
            requests_with(status).inc(count)
        self.by_status.clear()
        for counter, count in (
            (STARTED, self.started),
            (PROMPT_TOKENS, self.prompt_tokens),
            (GENERATED_TOKENS, self.generated_tokens),
        ):
            if count:
                counter.inc(count)
        self.started = self.prompt_tokens = self.generated_tokens = 0


LINES = LineCounts()
ADMISSION_LIMIT = Gauge(
    "batchstream_inference_admission_limit",
    "The remote engine: lines the worker may have on its server now (adapted to the server's load).",
)
SERVER_WAITING = Gauge(
    "batchstream_inference_server_waiting",
    "The remote engine: requests waiting in the server's queue at the last reading (anyone's).",
)
SERVER_REFUSALS = Counter(
    "batchstream_inference_server_refusals_total",
    "The remote engine: lines the server refused for load (429, or 503 with Retry-After), or "
    "could not take (unreachable); each is sent again once the server has room.",
    ["reason"],
)
