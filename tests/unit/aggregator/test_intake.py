"""The agent's body without faust: chunks acked only once stored, retried while a dependency is down."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from services.aggregator.intake import ResultsIntake


@dataclass(frozen=True)
class FakeMessage:
    key: bytes | None
    timestamp: float = 0.0


@dataclass(frozen=True)
class FakeEvent:
    """Stands in for faust's event: a value and its Kafka message."""

    value: bytes
    message: FakeMessage


def events(*values: bytes) -> list[FakeEvent]:
    return [FakeEvent(v, FakeMessage(b"batch_1")) for v in values]


class Recorder:
    """A processor that fails ``failures`` times first (a dependency down), and what it saw."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.attempts = 0
        self.stored: list[list[bytes | None]] = []
        self.acked: list[bytes] = []
        self.progress = 0
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

    async def ack(self, event: FakeEvent) -> None:
        assert self.stored, "acked before the chunk was stored"
        self.acked.append(event.value)

    async def after_chunk(self) -> None:
        self.flushes += 1
        self.done.set()

    def count_progress(self) -> None:
        self.progress += 1


def intake_for(recorder: Recorder) -> ResultsIntake[FakeEvent]:
    async def remaining(batch_id: str) -> int | None:
        return None

    return ResultsIntake(
        process=recorder.process,
        ack=recorder.ack,
        after_chunk=recorder.after_chunk,
        remaining=remaining,
        progress=recorder.count_progress,
        max_lines=2,
        max_age_s=60,
        retry_first_s=0.001,
        retry_max_s=0.002,
    )


async def test_a_chunk_is_retried_until_stored_then_acked_in_order() -> None:
    recorder = Recorder(failures=3)
    intake = intake_for(recorder)
    async with intake.running(tick_s=60):
        await intake.add(events(b"a", b"b"))
        await asyncio.wait_for(recorder.done.wait(), 10)
    assert recorder.attempts == 4 and recorder.stored == [[b"a", b"b"]]
    assert recorder.acked == [b"a", b"b"] and recorder.flushes == 1
    assert recorder.progress >= 1 + 4  # the poll, and every attempt (a retry is progress)


async def test_a_chunk_never_stored_is_never_acked_when_the_agent_stops() -> None:
    recorder = Recorder(failures=10**9)
    intake = intake_for(recorder)
    async with intake.running(tick_s=60):
        await intake.add(events(b"a", b"b"))
        await asyncio.wait_for(recorder.third_attempt.wait(), 10)
    assert recorder.acked == [] and recorder.stored == []
