"""ChunkCoalescer: chunks cut when full, when old, and at once when they finish a batch.

Events here are (batch id, line) tuples; time is a fake clock the tests move by hand.
"""

from __future__ import annotations

from collections.abc import Callable

from services.aggregator.coalescer import ChunkCoalescer
from tests.support.fakes import FakeClock

Event = tuple[str, int]


def make(
    remaining: dict[str, int], *, max_lines: int = 100, max_age_s: float = 0.5
) -> tuple[ChunkCoalescer[Event], list[list[Event]], FakeClock]:
    chunks: list[list[Event]] = []
    clock = FakeClock(100.0)

    async def submit(chunk: list[Event]) -> None:
        chunks.append(chunk)

    async def left(batch_id: str) -> int | None:
        return remaining.get(batch_id)

    batch_of: Callable[[Event], str | None] = lambda event: event[0]  # noqa: E731
    coalescer = ChunkCoalescer(
        submit, max_lines=max_lines, max_age_s=max_age_s, batch_of=batch_of, remaining=left, clock=clock
    )
    return coalescer, chunks, clock


async def test_a_batch_s_last_lines_are_cut_at_once() -> None:
    coalescer, chunks, _ = make({"a": 3, "b": 50})
    await coalescer.add([("a", 1), ("b", 1)])
    await coalescer.add([("a", 2)])
    assert chunks == [] and coalescer.pending == 3
    await coalescer.add([("b", 2), ("a", 3)])  # a's third and last line
    assert chunks == [[("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]]
    assert coalescer.pending == 0


async def test_lines_in_a_chunk_not_yet_settled_count_towards_the_batch() -> None:
    remaining = {"a": 4}
    coalescer, chunks, _ = make(remaining, max_lines=2)
    await coalescer.add([("a", 1), ("a", 2)])  # full: cut, but not in the table yet
    assert len(chunks) == 1
    await coalescer.add([("a", 3)])
    assert len(chunks) == 1
    await coalescer.add([("a", 4)])  # 2 in flight + 2 pending = the 4 the table lacks
    assert len(chunks) == 2
    # Once settled, the table's own count takes over (no double counting).
    coalescer.settled(chunks[0])
    remaining["a"] = 2
    coalescer.settled(chunks[1])
    remaining["a"] = 0
    await coalescer.add([("a", 4)])  # a redelivered duplicate of a finished batch: cut at once
    assert len(chunks) == 3


async def test_unknown_batches_wait_for_the_age_limit() -> None:
    coalescer, chunks, clock = make({})
    await coalescer.add([("x", 1)])
    clock.now += 0.4
    await coalescer.tick()
    assert chunks == []
    clock.now += 0.1
    await coalescer.tick()
    assert chunks == [[("x", 1)]]
    await coalescer.tick()
    assert len(chunks) == 1  # nothing pending: nothing cut


async def test_a_poll_after_the_age_limit_cuts_everything_pending() -> None:
    coalescer, chunks, clock = make({"a": 10})
    await coalescer.add([("a", 1)])
    clock.now += 0.6
    await coalescer.add([("a", 2)])
    assert chunks == [[("a", 1), ("a", 2)]]
    await coalescer.add([("a", 3)])  # the age counts from the oldest pending event
    assert len(chunks) == 1


async def test_full_chunks_are_cut_at_max_lines() -> None:
    coalescer, chunks, _ = make({}, max_lines=3)
    await coalescer.add([("a", 1), ("a", 2)])
    await coalescer.add([("a", 3), ("a", 4)])
    assert chunks == [[("a", 1), ("a", 2), ("a", 3), ("a", 4)]]
    await coalescer.add([])
    await coalescer.flush()
    assert len(chunks) == 1
