"""The per-batch state table (``BatchState.to_dict()`` by batch id).

Key placement. faust writes a table's changelog record to the *current event's* partition unless
the table has ``use_partitioner=True``. The agent processes chunks that mix events of several
partitions (``noack_take``), and the finalizer deletes keys outside any event, so the current
event says nothing about where a key belongs. Instead the table uses the producer's partitioner on
the raw batch-id key (``key_serializer="raw"``) over the same partition count as the results
topic: inference publishes results keyed by the raw batch id with aiokafka's default (murmur2)
partitioner, so a batch's changelog records land in the same partition number as its results,
and faust's co-partitioning assignor gives that changelog partition to the worker that owns the
results partition. On a rebalance the new owner recovers exactly the batches it now receives.
"""

from __future__ import annotations

from services.aggregator.app import app, kafka_settings

batch_states = app.Table(
    "batch-state",
    key_type=str,
    key_serializer="raw",
    value_serializer="json",
    partitions=kafka_settings.results_partitions,
    use_partitioner=True,
    help="Counts, usage and seen-lines bitmap of each batch in progress.",
)
