"""The per-batch state table (``BatchState.to_dict()`` by batch id).

Key placement. faust writes a table's changelog record to the *current event's* partition unless
the table has ``use_partitioner=True``. The agent processes chunks that mix events of several
partitions (``noack_take``), and the finalizer deletes keys outside any event, so the current
event says nothing about where a key belongs. Instead the table uses the producer's partitioner on
the raw batch-id bytes (``key_type=bytes`` makes faust use the ``raw`` key codec; ``str`` would
JSON-quote the key and change its hash) over the same partition count as the results topic.
Inference publishes results keyed by the raw batch id with aiokafka's default (murmur2)
partitioner, so a batch's changelog records land in the same partition number as its results,
and faust's co-partitioning assignor gives that changelog partition to the worker that owns the
results partition. On a rebalance the new owner recovers exactly the batches it now receives.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from services.aggregator.app import app, kafka_settings

batch_states_table = app.Table(
    "batch-state",
    key_type=bytes,
    partitions=kafka_settings.results_partitions,
    use_partitioner=True,
    help="Counts, usage and seen-lines bitmap of each batch in progress.",
)


class BatchStates(MutableMapping[str, Any]):
    """The table seen with ``str`` batch ids (faust stores and recovers the keys as bytes)."""

    def __init__(self, table: MutableMapping[Any, Any]) -> None:
        self._table = table

    def __getitem__(self, batch_id: str) -> Any:
        return self._table[batch_id.encode()]

    def __setitem__(self, batch_id: str, value: Any) -> None:
        self._table[batch_id.encode()] = value

    def __delitem__(self, batch_id: str) -> None:
        del self._table[batch_id.encode()]

    def __iter__(self) -> Iterator[str]:
        for key in list(self._table.keys()):
            yield key.decode() if isinstance(key, bytes) else str(key)

    def __len__(self) -> int:
        return len(self._table)


batch_states = BatchStates(batch_states_table)
