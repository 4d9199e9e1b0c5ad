"""The local stack's S3 stand-in (SeaweedFS) is not starved of memory by its own limit.

SeaweedFS holds ~232 MB of live Go heap from its start. Under the 256 MiB ``GOMEMLIMIT`` the local
stack used to set, the Go GC ran at its limit: a cycle every few hundred KB allocated, 14-20 cycles
per 30 round trips (18 for this test's 40) and 1-2 CPU s per parity batch, on the cores the engine
uses (docs/benchmarks.md, 2026-12-03). Counted here from its own Prometheus metrics
(``Ports.s3_metrics``), not timed.
"""

from __future__ import annotations

import urllib.request
import uuid

import pytest

from deploy.local import Stack
from shared.storage import ObjectStore

ROUND_TRIPS = 40
OBJECT_BYTES = 60_000  # about a result chunk of a busy batch


def gc_cycles(stack: Stack) -> float:
    """Garbage collections the S3 stand-in has run since it started."""
    url = f"http://127.0.0.1:{stack.ports.s3_metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("go_gc_duration_seconds_count "):
                return float(line.split()[1])
    raise AssertionError(f"{url} has no go_gc_duration_seconds_count")


async def test_round_trips_do_not_run_the_garbage_collector_each_time(stand_ins: Stack) -> None:
    if "s3" not in stand_ins.pids():  # MinIO from testcontainers, or a JuiceFS gateway
        pytest.skip("the S3 server is not the stack's SeaweedFS (its memory limit is what is checked)")
    store = ObjectStore(stand_ins.storage_settings())
    prefix = f"gc-check/{uuid.uuid4().hex}"
    data = bytes(range(256)) * (OBJECT_BYTES // 256)
    try:
        before = gc_cycles(stand_ins)
        for i in range(ROUND_TRIPS):
            await store.put_bytes(f"{prefix}/{i}", data)
            assert b"".join([chunk async for chunk in store.iter_chunks(f"{prefix}/{i}")]) == data
        cycles = gc_cycles(stand_ins) - before
    finally:
        await store.delete_prefix(prefix)
        store.close()
    # At the old limit: 18 cycles for these 80 requests; with room, none (or Go's periodic one).
    assert cycles < 10, f"{cycles:.0f} GC cycles in {2 * ROUND_TRIPS} requests: the memory limit starves it"
