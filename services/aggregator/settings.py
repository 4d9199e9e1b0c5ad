"""The aggregator's settings: the shared ``AggregatorSettings`` plus faust tuning knobs.

Same ``BATCHSTREAM_AGGREGATOR_`` prefix. The extra fields live here rather than in ``shared/``
because only this service (and only faust) reads them.
"""

from __future__ import annotations

from shared.settings import AggregatorSettings


class AggregatorConfig(AggregatorSettings):
    web_host: str = "127.0.0.1"  # 0.0.0.0 in a container
    # faust's broker defaults; tests lower them so a restarted worker rejoins in seconds.
    session_timeout_s: float = 60.0
    heartbeat_interval_s: float = 3.0
    rebalance_timeout_s: float = 60.0
    commit_interval_s: float = 2.8
    # 1 works around Tansu's wrong ListOffsets LATEST for multi-record batches (table recovery).
    producer_max_batch_size: int = 16384
    # Events faust buffers per partition before pausing its fetch; at faust's 4096 a fast
    # producer made the consumer stall ~1 s between bursts.
    stream_buffer_maxsize: int = 20_000
    # The longest a fetch waits for records (faust hard-codes 1500; see faust_adapter.py).
    fetch_max_wait_ms: int = 100
    # How often the results agent takes what arrived; chunks are cut from these polls (coalescer.py).
    chunk_poll_seconds: float = 0.1
    standby_replicas: int = 1
    finalize_concurrency: int = 2
    download_concurrency: int = 16
    batch_cache_size: int = 10_000
    # A cancelling batch ends ``cancelled`` once every line has a result, or this long after
    # ``cancelling_at``: lines still without one then get a ``batch_cancelled`` error line.
    cancel_timeout_s: float = 60.0
    # Most overdue batches (expired or cancel timed out) one sweep looks at.
    sweep_batch_limit: int = 500
    # The stall watchdog (watchdog.py): results waiting this long with nothing processed make the
    # worker answer 503 on /health and exit with status 70 after ``stall_exit_delay_s``; 0 means
    # any results seen waiting at a check. Owning no results partition for
    # ``stall_unassigned_timeout_s`` is a stall too (0: never; keep 0 for workers beyond the
    # results partition count, which own nothing by design). Checked every ``stall_check_seconds``.
    stall_timeout_s: float = 120.0
    stall_unassigned_timeout_s: float = 300.0
    stall_check_seconds: float = 5.0
    stall_exit_delay_s: float = 5.0
    # Results faust dropped after a rebalance (offset_gaps.py): a partition whose offsets from the
    # committed one up are neither acked nor in flight for ``gap_rewind_after_s`` is fetched again
    # from its committed offset. Checked every ``gap_check_seconds``.
    gap_rewind_after_s: float = 5.0
    gap_check_seconds: float = 1.0
