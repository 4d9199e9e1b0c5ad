"""Prometheus metrics of the inference worker (served on /metrics by ``health``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

REQUESTS = Counter(
    "batchstream_inference_requests_total",
    "Request messages processed, by outcome (HTTP-like status, or the never-ran error code).",
    ["status"],
)
STARTED = Counter(
    "batchstream_inference_started_total",
    "Requests handed to the engine (lines answered without running are not counted).",
)
IN_FLIGHT = Gauge("batchstream_inference_in_flight", "Requests currently running on the engine.")
PROMPT_TOKENS = Counter("batchstream_inference_prompt_tokens_total", "Prompt tokens processed.")
GENERATED_TOKENS = Counter("batchstream_inference_generated_tokens_total", "Completion tokens generated.")
SKIPPED = Counter(
    "batchstream_inference_skipped_messages_total", "Messages that were not valid request messages."
)
