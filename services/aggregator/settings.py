"""The aggregator's settings: the shared ``AggregatorSettings`` plus faust tuning knobs.

Same ``BATCHSTREAM_AGGREGATOR_`` prefix. The extra fields live here rather than in ``shared/``
because only this service (and only faust) reads them. Each field's docstring is its description
in docs/configuration.md (``python -m deploy.config_docs``).
"""

from __future__ import annotations

from shared.settings import AggregatorSettings


class AggregatorConfig(AggregatorSettings):
    """faust tuning and the aggregator's timers, read only by the aggregator."""

    web_host: str = "127.0.0.1"
    """Address of the aggregator's web server (``0.0.0.0`` in a container)."""
    session_timeout_s: float = 60.0
    """faust ``broker_session_timeout`` (faust's default; tests lower the broker timeouts so a
    restarted worker rejoins in seconds)."""
    group_instance_id: str = ""
    """Static group membership (Kafka's ``group.instance.id``, faust
    ``consumer_group_instance_id``): a name that stays the same across restarts of one aggregator
    instance and differs between instances (e.g. a StatefulSet pod name). A restarted member with
    the same name takes its partitions back at once instead of waiting up to
    ``session_timeout_s`` for the killed one to be dropped. Trade-off: a static member does not
    leave the group when it stops, so when an instance is removed for good its partitions move
    only after ``session_timeout_s``. Empty: dynamic membership."""
    heartbeat_interval_s: float = 3.0
    """faust ``broker_heartbeat_interval``."""
    rebalance_timeout_s: float = 60.0
    """faust ``broker_rebalance_timeout``."""
    commit_interval_s: float = 2.8
    """faust ``broker_commit_interval``: how often acked offsets are committed."""
    producer_max_batch_size: int = 16384
    """faust ``producer_max_batch_size`` (faust's default suits Kafka). 1 works around Tansu's
    wrong ListOffsets LATEST for multi-record batches, which faust's table recovery trusts: the
    test stacks on Tansu set it."""
    stream_buffer_maxsize: int = 20_000
    """Events faust buffers per partition before pausing its fetch; at faust's 4096 a fast
    producer made the consumer stall ~1 s between bursts."""
    fetch_max_wait_ms: int = 100
    """The longest a fetch waits for records (faust hard-codes 1500; see faust_adapter.py)."""
    chunk_poll_seconds: float = 0.1
    """How often the results agent takes what arrived; chunks are cut from these polls
    (``ChunkCoalescer`` in intake.py)."""
    standby_replicas: int = 1
    """faust ``table_standby_replicas`` of the batch-state table (the test stacks on Tansu set 0)."""
    finalize_concurrency: int = 2
    """Batches finalized at once by one worker."""
    download_concurrency: int = 16
    """Chunk objects one finalize downloads at once."""
    batch_cache_size: int = 10_000
    """Batch documents (status, total) kept in the worker's LRU cache."""
    cancel_timeout_s: float = 60.0
    """A cancelling batch ends ``cancelled`` once every line has a result, or this long after
    ``cancelling_at``: lines still without one then get a ``batch_cancelled`` error line."""
    sweep_batch_limit: int = 500
    """Most overdue batches (expired or cancel timed out) one sweep looks at."""
    stall_timeout_s: float = 120.0
    """The stall watchdog (watchdog.py): results waiting this long with nothing processed make the
    worker answer 503 on /health and exit with status 70 after ``stall_exit_delay_s``; 0 means
    any results seen waiting at a check."""
    stall_unassigned_timeout_s: float = 300.0
    """Owning no results partition this long is a stall too (0: never; keep 0 for workers beyond
    the results partition count, which own nothing by design)."""
    stall_check_seconds: float = 5.0
    """How often the stall watchdog checks."""
    stall_exit_delay_s: float = 5.0
    """Seconds between a detected stall and the exit with status 70."""
    gap_rewind_after_s: float = 5.0
    """Results faust dropped after a rebalance (offset_gaps.py): a partition whose offsets from the
    committed one up are neither acked nor in flight for this long is fetched again from its
    committed offset."""
    gap_check_seconds: float = 1.0
    """How often the offsets faust will not deliver are looked for."""
