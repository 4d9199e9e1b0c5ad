"""A line's journey (fake clock): committed past and unanswered lines are sent again, then lost."""

from __future__ import annotations

import base64

from services.api.dispatch.sent_lines import JourneyBook, SentLine
from shared.seen_lines import SeenLines
from tests.support.fakes import FakeClock


def sent(line: int, offset: int, attempt: int = 1) -> SentLine:
    return SentLine("b", line, start=line * 10, length=9, partition=0, offset=offset, attempt=attempt)


def seen_of(*lines: int) -> SeenLines:
    """The bitmap as the aggregator's counts flush stores it (``seen_lines``)."""
    bits = SeenLines()
    for line in lines:
        bits.add(line)
    return SeenLines.from_compressed(base64.b64decode(bits.encode()))


def test_the_aggregators_bitmap_reads_back_line_by_line() -> None:
    seen = seen_of(1, 9, 50_000)
    assert 1 in seen and 9 in seen and 50_000 in seen
    assert 2 not in seen and 50_001 not in seen
    assert 1 not in SeenLines.from_compressed(None)
    assert [seen.count_below(n) for n in (1, 2, 9, 10, 50_000, 50_001)] == [0, 1, 1, 2, 2, 3]


def test_a_line_is_sent_again_only_after_the_commit_and_the_grace_with_a_fake_clock() -> None:
    clock = FakeClock()
    book = JourneyBook(grace_s=10, max_attempts=3, takeover_grace_s=30)
    book.sent(sent(1, offset=0))
    book.sent(sent(2, offset=1))
    assert book.in_topic() == 2
    clock.advance(20)
    assert book.settle("b", seen_of(), clock()) == ([], [])  # not consumed yet: just queued
    book.committed({0: 2}, clock())
    assert book.in_topic() == 0
    clock.advance(5)
    assert book.settle("b", seen_of(1), clock()) == ([], [])  # line 1 answered, line 2 in grace
    clock.advance(6)
    # Line 2 is past its grace, but the aggregator counted line 1 only 6 s ago: it may be behind.
    assert book.settle("b", seen_of(1), clock()) == ([], [])
    clock.advance(4)
    again, lost = book.settle("b", seen_of(1), clock())
    assert [line.line for line in again] == [2] and lost == []
    assert not book.tracked("b", 1)


def test_a_line_that_keeps_vanishing_becomes_lost_after_the_last_attempt_with_a_fake_clock() -> None:
    clock = FakeClock()
    book = JourneyBook(grace_s=1, max_attempts=2, takeover_grace_s=30)
    book.sent(sent(7, offset=0))
    book.committed({0: 1}, clock())
    assert book.settle("b", seen_of(), clock()) == ([], [])  # first look: nothing known yet
    clock.advance(2)
    (again,), _ = book.settle("b", seen_of(), clock())
    assert again.attempt == 1
    book.sent(sent(7, offset=5))  # sent again: attempt 2
    book.committed({0: 6}, clock())
    clock.advance(2)
    again_twice, lost = book.settle("b", seen_of(), clock())
    assert again_twice == [] and [(line.line, line.attempt) for line in lost] == [(7, 2)]
    assert len(book) == 0


def test_a_takeover_doubts_earlier_lines_only_after_its_grace_with_a_fake_clock() -> None:
    clock = FakeClock()
    book = JourneyBook(grace_s=1, max_attempts=3, takeover_grace_s=30)
    book.doubt("b", upto_line=100, upto_byte=5000, sent=99, now=clock())
    book.doubt("fresh", upto_line=1, upto_byte=0, sent=0, now=clock())  # nothing sent before: no doubt
    assert book.batches_to_check() == {"b"}
    clock.advance(29)
    assert book.due_doubt("b", clock()) is None
    clock.advance(1)
    doubt = book.due_doubt("b", clock())
    assert doubt is not None and doubt.upto_line == 100
    assert book.due_doubt("b", clock()) is None  # consumed


def test_a_cancelled_batch_settles_once_every_sent_line_came_back_with_a_fake_clock() -> None:
    clock = FakeClock()
    book = JourneyBook(grace_s=5, max_attempts=3, takeover_grace_s=30)
    book.sent(sent(1, offset=0))
    book.sent(sent(2, offset=1))
    assert not book.cancel_settled("b", seen_of(1), clock())  # line 2 still in the topic
    book.committed({0: 2}, clock())
    assert not book.cancel_settled("b", seen_of(1), clock())  # its result may be on its way
    assert book.cancel_settled("b", seen_of(1, 2), clock())
    clock.advance(5)
    assert book.cancel_settled("b", seen_of(1), clock())  # lost: finalize fills it
    assert book.cancel_settled("never-sent", seen_of(), clock())


def test_lines_answered_behind_a_running_one_are_counted_until_the_commit_passes_them() -> None:
    book = JourneyBook(grace_s=10, max_attempts=3, takeover_grace_s=30)
    for line in range(1, 6):  # line 1 is long: the worker cannot commit past offset 0
        book.sent(sent(line, offset=line - 1))
    assert book.batches_to_check() == {"b"}  # nothing committed yet, and still looked at
    book.settle("b", seen_of(2, 3, 4), now=1.0)
    assert book.answered_by_partition() == {0: 3} and book.in_topic() == 2
    book.committed({0: 3}, now=2.0)  # line 1 ended: the commit passed lines 1 to 3, not 4
    assert book.answered_by_partition() == {0: 1}
    book.forget(["b"])
    assert book.answered_by_partition() == {}
