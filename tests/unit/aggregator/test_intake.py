"""The intake without faust: chunks cut when full, old or a batch's last lines; one in flight, in
order; acked only once stored; retried while a dependency is down."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from services.aggregator.intake import ChunkCoalescer, ResultsIntake
from services.aggregator.settings import AggregatorConfig
from shared.protocol.messages import RESULT_COUNT_HEADER
from tests.support.fakes import FakeClock


@dataclass(frozen=True)
class FakeMessage:
    key: bytes | None
    timestamp: float = 0.0
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class FakeEvent:
    """Stands in for faust's event: a value and its Kafka message."""

    value: bytes
    message: FakeMessage


def events(*values: bytes) -> list[FakeEvent]:
    return [FakeEvent(v, FakeMessage(b"batch_1")) for v in values]


def event(batch_id: str, line: int) -> FakeEvent:
    return FakeEvent(str(line).encode(), FakeMessage(batch_id.encode()))


class Recorder:
    """Stands in for the processor, the stream and the stall check: a processor that fails
    ``failures`` times first (a dependency down), and what it saw."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.attempts = 0
        self.stored: list[list[bytes | None]] = []
        self.acked: list[bytes] = []
        self.progress_calls = 0
        self.flushes = 0
        self.done = asyncio.Event()
        self.third_attempt = asyncio.Event()

    async def process(self, values: Sequence[bytes | None]) -> None:
        self.attempts += 1
        if self.attempts == 3:
            self.third_attempt.set()
        if self.attempts <= self.failures:
            raise ConnectionError("mongo is down")
        self.stored.append(list(values))

    async def remaining(self, batch_id: str) -> int | None:
        return None

    async def ack(self, event: FakeEvent) -> None:
        assert self.stored, "acked before the chunk was stored"
        self.acked.append(event.value)

    async def flush_counts(self) -> None:
        self.flushes += 1
        self.done.set()

    def progress(self) -> None:
        self.progress_calls += 1


def intake_for(recorder: Recorder) -> ResultsIntake[FakeEvent]:
    config = AggregatorConfig(chunk_lines=2, chunk_seconds=60, chunk_poll_seconds=60)
    return ResultsIntake(
        config,
        stream=recorder,
        processor=recorder,  # type: ignore[arg-type]
        stall_check=recorder,  # type: ignore[arg-type]
        retry_first_s=0.001,
        retry_max_s=0.002,
    )


async def test_a_chunk_is_retried_until_stored_then_acked_in_order() -> None:
    recorder = Recorder(failures=3)
    intake = intake_for(recorder)
    async with intake.running():
        await intake.add(events(b"a", b"b"))
        await asyncio.wait_for(recorder.done.wait(), 10)
    assert recorder.attempts == 4 and recorder.stored == [[b"a", b"b"]]
    assert recorder.acked == [b"a", b"b"] and recorder.flushes == 1
    assert recorder.progress_calls >= 1 + 4  # the poll, and every attempt (a retry is progress)


async def test_a_chunk_never_stored_is_never_acked_when_the_agent_stops() -> None:
    recorder = Recorder(failures=10**9)
    intake = intake_for(recorder)
    async with intake.running():
        await intake.add(events(b"a", b"b"))
        await asyncio.wait_for(recorder.third_attempt.wait(), 10)
    assert recorder.acked == [] and recorder.stored == []


class BlockingRecorder(Recorder):
    """A processor that holds the chunk starting with ``b"1"`` until released, and the order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.release = asyncio.Event()
        self.second_flushed = asyncio.Event()

    async def process(self, values: Sequence[bytes | None]) -> None:
        first = (values[0] or b"").decode()
        self.log.append(f"start {first}")
        if first == "1":
            await self.release.wait()
        self.log.append(f"done {first}")
        await super().process(values)

    async def flush_counts(self) -> None:
        await super().flush_counts()
        if self.flushes == 2:
            self.second_flushed.set()


async def test_chunks_are_handled_one_at_a_time_in_order() -> None:
    recorder = BlockingRecorder()
    intake = intake_for(recorder)
    async with intake.running():
        await asyncio.wait_for(intake.add(events(b"1", b"1")), 1)  # returns at once: collect on
        await asyncio.sleep(0)
        assert recorder.log == ["start 1"]
        second = asyncio.create_task(intake.add(events(b"2", b"2")))
        await asyncio.sleep(0.01)
        assert not second.done() and recorder.log == ["start 1"]  # waits for chunk 1 to finish
        recorder.release.set()
        await second
        await asyncio.wait_for(recorder.second_flushed.wait(), 10)
    assert recorder.log == ["start 1", "done 1", "start 2", "done 2"]
    assert recorder.acked == [b"1", b"1", b"2", b"2"]


async def test_a_failed_chunk_surfaces_at_the_next_chunk() -> None:
    recorder = Recorder()

    async def ack(event: FakeEvent) -> None:
        raise RuntimeError("boom")

    recorder.ack = ack  # type: ignore[method-assign]
    intake = intake_for(recorder)
    async with intake.running():
        await intake.add(events(b"a", b"b"))
        await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError):
            await intake.add(events(b"c", b"d"))


# --- where a chunk ends


class Remaining:
    def __init__(self, left: dict[str, int]) -> None:
        self.left = left

    async def remaining(self, batch_id: str) -> int | None:
        return self.left.get(batch_id)


class Cuts:
    """The coalescer with the chunks it cut collected; time is a fake clock moved by hand."""

    def __init__(self, remaining: dict[str, int], *, max_lines: int = 100, max_age_s: float = 0.5) -> None:
        self.left = Remaining(remaining)
        self.clock = FakeClock(100.0)
        self.coalescer: ChunkCoalescer[FakeEvent] = ChunkCoalescer(
            self.left,  # type: ignore[arg-type]
            max_lines=max_lines,
            max_age_s=max_age_s,
            clock=self.clock,
        )
        self.chunks: list[list[FakeEvent]] = []

    async def add(self, *items: tuple[str, int]) -> None:
        self._keep(await self.coalescer.add([event(b, line) for b, line in items]))

    def tick(self) -> None:
        self._keep(self.coalescer.tick())

    def _keep(self, chunk: list[FakeEvent] | None) -> None:
        if chunk:
            self.chunks.append(chunk)


def chunk(*items: tuple[str, int]) -> list[FakeEvent]:
    return [event(b, line) for b, line in items]


async def test_a_batch_s_last_lines_are_cut_at_once() -> None:
    cuts = Cuts({"a": 3, "b": 50})
    await cuts.add(("a", 1), ("b", 1))
    await cuts.add(("a", 2))
    assert cuts.chunks == [] and cuts.coalescer.pending == 3
    await cuts.add(("b", 2), ("a", 3))  # a's third and last line
    assert cuts.chunks == [chunk(("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3))]
    assert cuts.coalescer.pending == 0


async def test_lines_in_a_chunk_not_yet_settled_count_towards_the_batch() -> None:
    cuts = Cuts({"a": 4}, max_lines=2)
    await cuts.add(("a", 1), ("a", 2))  # full: cut, but not in the table yet
    assert len(cuts.chunks) == 1
    await cuts.add(("a", 3))
    assert len(cuts.chunks) == 1
    await cuts.add(("a", 4))  # 2 in flight + 2 pending = the 4 the table lacks
    assert len(cuts.chunks) == 2
    # Once settled, the table's own count takes over (no double counting).
    cuts.coalescer.settled(cuts.chunks[0])
    cuts.left.left["a"] = 2
    cuts.coalescer.settled(cuts.chunks[1])
    cuts.left.left["a"] = 0
    await cuts.add(("a", 4))  # a redelivered duplicate of a finished batch: cut at once
    assert len(cuts.chunks) == 3


async def test_unknown_batches_wait_for_the_age_limit() -> None:
    cuts = Cuts({})
    await cuts.add(("x", 1))
    cuts.clock.now += 0.4
    cuts.tick()
    assert cuts.chunks == []
    cuts.clock.now += 0.1
    cuts.tick()
    assert cuts.chunks == [chunk(("x", 1))]
    cuts.tick()
    assert len(cuts.chunks) == 1  # nothing pending: nothing cut


async def test_a_poll_after_the_age_limit_cuts_everything_pending() -> None:
    cuts = Cuts({"a": 10})
    await cuts.add(("a", 1))
    cuts.clock.now += 0.6
    await cuts.add(("a", 2))
    assert cuts.chunks == [chunk(("a", 1), ("a", 2))]
    await cuts.add(("a", 3))  # the age counts from the oldest pending event
    assert len(cuts.chunks) == 1


async def test_full_chunks_are_cut_at_max_lines() -> None:
    cuts = Cuts({}, max_lines=3)
    await cuts.add(("a", 1), ("a", 2))
    await cuts.add(("a", 3), ("a", 4))
    assert cuts.chunks == [chunk(("a", 1), ("a", 2), ("a", 3), ("a", 4))]
    await cuts.add()
    cuts._keep(cuts.coalescer.cut())
    assert len(cuts.chunks) == 1


async def test_a_group_of_results_counts_as_its_results() -> None:
    """A worker's group of a batch's results (its count in a header) counts as that many lines:
    towards the batch's last lines and towards a full chunk."""
    cuts = Cuts({"a": 10, "b": 100}, max_lines=50)
    group = FakeEvent(b"group", FakeMessage(b"a", headers=((RESULT_COUNT_HEADER, b"9"),)))
    cuts._keep(await cuts.coalescer.add([group]))
    assert cuts.chunks == []
    await cuts.add(("a", 10))  # 9 + 1: the batch's last line
    assert len(cuts.chunks) == 1
    big = FakeEvent(b"big", FakeMessage(b"b", headers=((RESULT_COUNT_HEADER, b"60"),)))
    cuts._keep(await cuts.coalescer.add([big]))  # 60 results: over max_lines
    assert len(cuts.chunks) == 2
