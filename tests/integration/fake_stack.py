"""Settings for a stack on the instant fake engine (every such test stack starts from these).

The aggregator's are the Tansu workarounds (one-record producer batches for table recovery, no
standby) and short chunk, flush and group timings so small batches end in about a second.
"""

from __future__ import annotations

FAKE_STACK_ENV = {
    "BATCHSTREAM_AGGREGATOR_CHUNK_SECONDS": "0.2",
    "BATCHSTREAM_AGGREGATOR_COUNTS_FLUSH_SECONDS": "0.3",
    "BATCHSTREAM_AGGREGATOR_SWEEP_SECONDS": "1",
    "BATCHSTREAM_AGGREGATOR_SESSION_TIMEOUT_S": "6",
    "BATCHSTREAM_AGGREGATOR_HEARTBEAT_INTERVAL_S": "1",
    "BATCHSTREAM_AGGREGATOR_REBALANCE_TIMEOUT_S": "6",
    "BATCHSTREAM_AGGREGATOR_COMMIT_INTERVAL_S": "0.5",
    "BATCHSTREAM_AGGREGATOR_PRODUCER_MAX_BATCH_SIZE": "1",
    "BATCHSTREAM_AGGREGATOR_STANDBY_REPLICAS": "0",
}
