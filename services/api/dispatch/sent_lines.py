"""Each dispatched line's journey to its result, and what to do when a hop dropped it.

A line is tracked from its send (partition, offset) until the aggregator has seen its result.
Once the inference group has committed past its offset, the worker has published its result (the
worker commits only after the result is acknowledged); if the aggregator still has not seen it
``grace_s`` later, and has counted nothing new of the batch for ``grace_s`` (so it is not merely
behind), a hop lost it, and the line is sent again, at most ``max_attempts`` times in
all; after that it becomes a ``line_lost`` error line (published to the results topic, so the
aggregator counts it like any result) and the batch can still complete.

Which lines the aggregator has seen comes from the batch document's ``seen_lines``: the aggregator's
seen-lines bitmap (zlib-compressed, bit ``n - 1`` for line ``n``) written with its batched counts
flush. The book is pure (no I/O, time passed in); ``loop.py`` feeds it.

A dispatcher that takes over does not know the offsets of lines an earlier one sent: it keeps a
*doubt* per batch (lines below the position it resumed from) and, ``takeover_grace_s`` later, sends
again those still without a result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from shared.seen_lines import SeenLines

LOST_CODE = "line_lost"


@dataclass(slots=True)
class SentLine:
    batch_id: str
    line: int
    start: int  # byte offset of the line in the input file
    length: int
    partition: int
    offset: int
    attempt: int = 1
    committed_at: float | None = None  # when the group's commit passed its offset


@dataclass(frozen=True, slots=True)
class Doubt:
    batch_id: str
    upto_line: int  # lines below this were sent by an earlier dispatcher
    upto_byte: int
    sent: int  # how many request lines that was
    since: float


class JourneyBook:
    def __init__(self, grace_s: float, max_attempts: int, takeover_grace_s: float) -> None:
        self.grace_s = grace_s
        self.max_attempts = max(1, max_attempts)
        self.takeover_grace_s = takeover_grace_s
        self._lines: dict[str, dict[int, SentLine]] = {}  # batch -> line number -> its journey
        self._uncommitted: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
        # Lines with a result the group has not committed past (a line before them still runs).
        self._answered: dict[int, dict[tuple[str, int], int]] = defaultdict(dict)
        self._doubts: dict[str, Doubt] = {}
        self._progress: dict[str, tuple[int, float]] = {}  # batch -> (lines seen, when it grew)

    def __len__(self) -> int:
        return sum(map(len, self._lines.values()))

    def sent(self, line: SentLine) -> None:
        key = (line.batch_id, line.line)
        lines = self._lines.setdefault(line.batch_id, {})
        old = lines.get(line.line)
        if old is not None:
            self._uncommitted[old.partition].pop(key, None)
            line.attempt = max(line.attempt, old.attempt + 1)
        lines[line.line] = line
        self._uncommitted[line.partition][key] = line.offset

    def in_topic(self) -> int:
        """Our lines the group has not committed past yet (queued, or running in a worker)."""
        return sum(len(p) for p in self._uncommitted.values())

    def in_topic_by_partition(self) -> dict[int, int]:
        """``in_topic`` per partition (what a worker has queued or running of ours)."""
        return {p: len(lines) for p, lines in self._uncommitted.items()}

    def answered_by_partition(self) -> dict[int, int]:
        """Our lines the aggregator has a result of while the group has not committed past them,
        per partition: a worker commits a partition only up to its oldest line still running, so
        behind one long line the lines done after it stay in the measured backlog."""
        return {p: len(lines) for p, lines in self._answered.items() if lines}

    def committed(self, offsets: dict[int, int], now: float) -> None:
        """The group's committed offset per partition: lines below it have a published result."""
        for partition, committed in offsets.items():
            answered = self._answered.get(partition)
            if answered:
                for key in [k for k, off in answered.items() if off < committed]:
                    del answered[key]
            waiting = self._uncommitted.get(partition)
            if not waiting:
                continue
            for key in [k for k, off in waiting.items() if off < committed]:
                del waiting[key]
                self._lines[key[0]][key[1]].committed_at = now

    def batches_to_check(self) -> set[str]:
        """Batches with lines sent, or doubts: read their ``seen_lines`` (a line past the commit
        may be lost; one before it may have its result while an older line still runs)."""
        return {b for b, lines in self._lines.items() if lines} | set(self._doubts)

    def progress(self, batch_id: str, seen: SeenLines, now: float) -> float:
        """When the aggregator last counted a new line of the batch (as far as we looked)."""
        count = seen.count_below(1 << 40)
        last = self._progress.get(batch_id)
        if last is None or count > last[0]:
            self._progress[batch_id] = (count, now)
            return now
        return last[1]

    def settle(self, batch_id: str, seen: SeenLines, now: float) -> tuple[list[SentLine], list[SentLine]]:
        """Drop lines with a result; return ``(send_again, give_up)`` among the overdue rest.

        Overdue: committed past ``grace_s`` ago, and the aggregator has counted no new line of
        the batch for ``grace_s`` either: while it is still working through the batch's results
        (it may trail the workers by many seconds under load), a missing line may just be late.
        """
        again: list[SentLine] = []
        lost: list[SentLine] = []
        stalled = self.progress(batch_id, seen, now) + self.grace_s <= now
        for line in list(self._lines.get(batch_id, {}).values()):
            key = (batch_id, line.line)
            if line.line in seen:
                if line.committed_at is None:
                    self._answered[line.partition][key] = line.offset
                self._drop(key)
            elif stalled and line.committed_at is not None and line.committed_at + self.grace_s <= now:
                if line.attempt >= self.max_attempts:
                    self._drop(key)
                    lost.append(line)
                else:
                    again.append(line)
        return again, lost

    def cancel_settled(self, batch_id: str, seen: SeenLines, now: float) -> bool:
        """A cancelled batch: True once every line sent has a result or can no longer get one
        (consumed and committed past ``grace_s`` ago), so it may end before the cancel timeout."""
        doubt = self._doubts.get(batch_id)
        if doubt is not None and doubt.since + self.takeover_grace_s > now:
            return False
        for number, line in self._lines.get(batch_id, {}).items():
            if number in seen:
                continue
            if line.committed_at is None or line.committed_at + self.grace_s > now:
                return False
        return True

    def doubt(self, batch_id: str, upto_line: int, upto_byte: int, sent: int, now: float) -> None:
        if upto_line > 1 and batch_id not in self._doubts:
            self._doubts[batch_id] = Doubt(batch_id, upto_line, upto_byte, sent, now)

    def due_doubt(self, batch_id: str, now: float) -> Doubt | None:
        """A doubt old enough to act on, once the batch's count has stood still for ``grace_s``
        (call :meth:`settle` first); it is consumed."""
        doubt = self._doubts.get(batch_id)
        if doubt is None or doubt.since + self.takeover_grace_s > now:
            return None
        if self._progress.get(batch_id, (0, float("-inf")))[1] + self.grace_s > now:
            return None
        del self._doubts[batch_id]
        return doubt

    def tracked(self, batch_id: str, line: int) -> bool:
        return line in self._lines.get(batch_id, ())

    def forget_line(self, batch_id: str, line: int) -> None:
        """A line that has its result another way (its error result): no longer tracked."""
        if self.tracked(batch_id, line):
            self._drop((batch_id, line))

    def forget(self, batch_ids: Iterable[str]) -> None:
        gone = set(batch_ids)
        for batch_id in gone:
            for number in list(self._lines.get(batch_id, ())):
                self._drop((batch_id, number))
        for answered in self._answered.values():
            for key in [k for k in answered if k[0] in gone]:
                del answered[key]
        for batch_id in gone:
            self._doubts.pop(batch_id, None)
            self._progress.pop(batch_id, None)

    def _drop(self, key: tuple[str, int]) -> None:
        lines = self._lines[key[0]]
        line = lines.pop(key[1])
        if not lines:
            del self._lines[key[0]]
        self._uncommitted[line.partition].pop(key, None)
