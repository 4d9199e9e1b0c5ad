"""A resumed batch's lines with a stored result are passed over, a bounded number per round."""

from __future__ import annotations

import pytest

from services.api.dispatch import state as dispatch_state
from services.api.dispatch.state import QueuedState
from shared.input_lines import InputLine
from shared.protocol.messages import SamplingDefaults
from shared.seen_lines import SeenLines
from shared.stores.dispatcher import Position


class FakeCursorOfLines:
    """Stands in for the input cursor: lines 1..n, handed out in order (no object storage)."""

    def __init__(self, count: int) -> None:
        self.lines = [InputLine(n, n * 10, b"{}") for n in range(1, count + 1)]
        self.at = 0

    async def take(self, count: int) -> list[InputLine]:
        taken, self.at = self.lines[self.at : self.at + count], self.at + count
        return taken


def queued(answered: SeenLines | None) -> QueuedState:
    batch = QueuedState(
        batch_id="b",
        model="m",
        project="p",
        status="in_progress",
        total=100,
        priority=0,
        expires_at=float("inf"),
        order=0,
        object_key="k",
        defaults=SamplingDefaults(),
        position=Position(),
    )
    batch.answered = answered
    return batch


async def test_answered_lines_are_passed_over_and_counted_as_skipped() -> None:
    answered = SeenLines()
    for n in (1, 2, 3, 5, 8):
        answered.add(n)
    batch = queued(answered)
    cursor = FakeCursorOfLines(10)
    taken = await batch.take_unanswered(cursor, 4)  # type: ignore[arg-type]
    assert [line.number for line in taken] == [4, 6, 7, 9]
    assert batch.skipped == 5  # 1, 2, 3, 5 and 8: read to fill the four places
    rest = await batch.take_unanswered(cursor, 4)  # type: ignore[arg-type]
    assert [line.number for line in rest] == [10] and batch.skipped == 5


async def test_a_mostly_answered_batch_moves_on_a_bounded_stretch_per_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatch_state, "SKIP_PER_ROUND", 50)
    answered = SeenLines()
    for n in range(1, 1000):
        answered.add(n)
    batch = queued(answered)
    cursor = FakeCursorOfLines(1000)
    taken = await batch.take_unanswered(cursor, 10)  # type: ignore[arg-type]
    assert taken == [] and 50 <= batch.skipped < 60  # the round ends; the next goes on


async def test_a_batch_that_was_not_resumed_takes_its_lines_as_they_come() -> None:
    batch = queued(None)
    taken = await batch.take_unanswered(FakeCursorOfLines(3), 5)  # type: ignore[arg-type]
    assert [line.number for line in taken] == [1, 2, 3] and batch.skipped == 0
