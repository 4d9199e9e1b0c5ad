from __future__ import annotations

import itertools
from typing import Any

import pytest

from services.aggregator.counting import PROGRESS_AGE_DIVISOR, ChunkProcessor, CountsFlusher, decode_results
from services.aggregator.settings import AggregatorConfig
from services.aggregator.state import BatchState
from shared.kafka import encode
from shared.protocol.messages import ResponsePayload, ResultMessage
from shared.stores.batch_progress import BatchSummary


def raw(batch_id: str | None, line: int, status: int = 200) -> bytes:
    return encode(
        ResultMessage(
            request_id=f"batch_req_{line}",
            custom_id=f"c{line}",
            batch_id=batch_id,
            line=line,
            response=ResponsePayload(status_code=status, request_id="r", body={}),
        )
    )


class FakeDirectory:
    def __init__(self, infos: dict[str, BatchSummary]) -> None:
        self.infos = infos

    async def get(self, batch_id: str) -> BatchSummary | None:
        return self.infos.get(batch_id)

    def cached(self, batch_id: str) -> BatchSummary | None:
        return self.infos.get(batch_id)


class FakeWriter:
    def __init__(self, fail: bool = False) -> None:
        self.chunks: list[tuple[str, list[int | None]]] = []
        self.discarded: list[str] = []
        self.fail = fail

    async def ensure_bucket(self) -> None:
        pass

    async def write(self, batch_id: str, results: list[ResultMessage]) -> str:
        if self.fail:
            raise OSError("storage down")
        self.chunks.append((batch_id, [r.line for r in results]))
        return f"key-{len(self.chunks)}"

    async def discard(self, key: str) -> None:
        self.discarded.append(key)


class FakeCounts:
    def __init__(self) -> None:
        self.dirty: set[str] = set()

    def mark(self, batch_id: str) -> None:
        self.dirty.add(batch_id)


class FakeFinalize:
    def __init__(self) -> None:
        self.scheduled: list[str] = []

    def schedule(self, batch_id: str) -> None:
        self.scheduled.append(batch_id)


def make(writer: FakeWriter, status: str = "in_progress", total: int = 3) -> tuple[Any, ...]:
    states: dict[str, Any] = {}
    finalize = FakeFinalize()
    directory = FakeDirectory({"b1": BatchSummary("b1", status, total, "p", None)})
    counts = FakeCounts()
    processor = ChunkProcessor(
        AggregatorConfig(),
        states=states,
        directory=directory,  # type: ignore[arg-type]
        writer=writer,  # type: ignore[arg-type]
        counts=counts,  # type: ignore[arg-type]
        finalize=finalize,  # type: ignore[arg-type]
    )
    return processor, states, counts, finalize.scheduled


def test_decode_skips_undecodable_and_batchless() -> None:
    grouped = decode_results([b"not json", raw(None, 1), raw("b1", 2), b"{}", None])
    assert list(grouped) == ["b1"] and [r.line for r in grouped["b1"]] == [2]


async def test_duplicates_counted_once_and_finalize_scheduled() -> None:
    writer = FakeWriter()
    processor, states, counts, finalized = make(writer)
    await processor.process([raw("b1", 2), raw("b1", 1, 404), raw("b1", 2)])
    await processor.process([raw("b1", 1), raw("b1", 3)])
    assert writer.chunks == [("b1", [1, 2]), ("b1", [3])]
    state = BatchState.from_dict(states["b1"])
    assert (state.completed, state.failed) == (2, 1)
    assert counts.dirty == {"b1"} and finalized == ["b1"]


async def test_state_untouched_when_chunk_write_fails() -> None:
    processor, states, counts, finalized = make(FakeWriter(fail=True))
    with pytest.raises(OSError):
        await processor.process([raw("b1", 1)])
    assert states == {} and not counts.dirty and not finalized


async def test_terminal_and_unknown_batches_are_dropped() -> None:
    writer = FakeWriter()
    processor, states, _, _ = make(writer, status="completed")
    await processor.process([raw("b1", 1), raw("other", 1)])
    assert writer.chunks == [] and states == {}


async def test_a_batch_ended_by_a_finalize_during_the_write_keeps_no_chunk_and_no_state() -> None:
    """Finalize (expiry, cancel timeout) ran while the chunk was written: nothing comes back."""
    writer = FakeWriter()
    processor, states, counts, finalized = make(writer, status="cancelling")
    directory = processor._directory
    write = writer.write

    async def write_while_finalized(batch_id: str, results: list[ResultMessage]) -> str:
        key = await write(batch_id, results)
        directory.infos["b1"] = BatchSummary("b1", "cancelled", 3, "p", None)  # Finalizer.cleanup's mark
        return key

    writer.write = write_while_finalized  # type: ignore[method-assign]
    await processor.process([raw("b1", 1), raw("b1", 2)])
    assert writer.discarded == ["key-1"]
    assert "b1" not in states and not counts.dirty and not finalized


class RecordingBatchStore:
    """Keeps what ``live_counts`` was asked to write (no database: the sampling rule alone)."""

    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    async def live_counts(self, counts: dict[str, Any]) -> int:
        self.writes.append(dict(counts))
        return len(counts)


async def test_progress_samples_thin_out_as_a_batch_ages_with_a_fake_clock() -> None:
    store, now = RecordingBatchStore(), [1000.0]
    states = {"b": BatchState().to_dict()}
    flusher = CountsFlusher(store, states, clock=lambda: now[0])  # type: ignore[arg-type]
    sampled_at = []
    for step in range(3000):  # one flush every 0.25 s for 750 s
        now[0] = 1000.0 + step * 0.25
        flusher.mark("b")
        await flusher.flush()
        if store.writes[-1]["b"].sample:
            sampled_at.append(now[0] - 1000.0)
    gaps = [b - a for a, b in itertools.pairwise(sampled_at)]
    assert sampled_at[0] == 0.0 and min(gaps) >= 1.0  # never more than one a second
    assert gaps[-1] >= (sampled_at[-1] / PROGRESS_AGE_DIVISOR) - 0.25  # sparser with age
    assert 300 < len(sampled_at) < 600  # 750 s of flushes fit in the kept samples
    states.pop("b")  # finalized: the sampling memory goes with the state
    flusher.mark("b")
    await flusher.flush()
    assert flusher._sampled == {}


async def test_each_flush_carries_the_batch_s_recent_rate_with_a_fake_clock() -> None:
    store, now = RecordingBatchStore(), [1000.0]
    states = {"b": BatchState().to_dict()}
    flusher = CountsFlusher(store, states, clock=lambda: now[0])  # type: ignore[arg-type]
    rates = []
    for step in range(11):  # 20 lines a second for 5 s, a flush every half second
        now[0] = 1000.0 + step * 0.5
        states["b"] = BatchState(completed=10 * step).to_dict()
        flusher.mark("b")
        await flusher.flush()
        rates.append(store.writes[-1]["b"].rate)
    assert rates[:4] == [None] * 4  # the counts span less than 2 s
    assert rates[-1] == pytest.approx(20.0)
    states.pop("b")  # finalized: its rate's notes go with the state
    flusher.mark("b")
    await flusher.flush()
    assert "b" not in flusher._rates._notes
