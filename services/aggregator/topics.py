"""The results topic as faust sees it: raw bytes in, parsed by the agent (bad input never crashes it)."""

from __future__ import annotations

from services.aggregator.app import app, kafka_settings
from shared.topics import results_topic

results = app.topic(
    results_topic(kafka_settings),
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
    partitions=kafka_settings.results_partitions,
    internal=False,
)
