"""What the dispatcher keeps in memory: per batch it may dispatch, per model, per line being sent."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from services.api.dispatch.meter import Backlog
from services.api.dispatch.order import Affinity, OrderCursor, scan_order
from services.api.dispatch.policy import FairSharePolicy, QueuedBatch, SendRate
from services.api.dispatch.reader import InputCursor, InputLine, scan
from services.api.dispatch.sent_lines import JourneyBook, SentLine
from services.api.dispatch.settings import DispatchSettings
from shared.protocol.messages import RequestDefaults, SamplingDefaults, message_defaults
from shared.seen_lines import SeenLines
from shared.storage import ObjectStore, dispatch_order_key
from shared.stores.dispatcher import DispatchView, Position, dispatch_unit

REFUSALS = ""
"""The model of a mixed batch's part whose lines name no served model: the dispatcher answers
each with a ``model_not_found`` error result (no worker runs them)."""

SKIP_PER_ROUND = 20_000
"""Answered lines of a resumed batch the dispatcher passes over in one round, at most."""


@dataclass
class QueuedState:
    """One batch (or one part of a mixed batch: ``part``) the dispatcher may send lines of."""

    batch_id: str
    model: str
    project: str
    status: str
    total: int
    priority: int
    expires_at: float
    order: int
    object_key: str
    defaults: SamplingDefaults
    position: Position
    ordered: bool = False  # sent in its dispatch order (order.py), not in file order
    emitted: bool = False
    settled: bool = False  # cancelling, and every line sent came back (dispatch_settled)
    started: bool = False
    cursor: InputCursor | OrderCursor | None = None
    dirty: bool = False  # the position moved since it was saved
    saved_at: float = 0.0
    answered: SeenLines | None = None  # resumed: the lines that had a result (not sent again)
    skipped: int = 0  # of those, passed over by the cursor and not yet counted in the position
    part: int | None = None  # a mixed batch's part: its lines are those of its own dispatch order
    parts: int = 1
    rate: SendRate = field(default_factory=SendRate)  # its lines sent per second (deadline risk)

    @classmethod
    def from_view(cls, view: DispatchView, object_key: str, position: Position) -> QueuedState:
        # The dispatcher only takes batches whose model is known, and a mixed batch's parts.
        assert view.model is not None or view.part is not None
        return cls(
            batch_id=view.batch_id,
            model=view.model or REFUSALS,
            project=view.project,
            status=view.status,
            total=view.total,
            priority=view.priority,
            expires_at=view.expires_at,
            order=view.sort_key,
            object_key=object_key,
            defaults=SamplingDefaults.model_validate(view.defaults),
            position=position,
            ordered=view.prefix_order or view.part is not None,
            emitted=view.emitted,
            started=position.sent > 0,
            part=view.part,
            parts=view.parts,
        )

    @property
    def unit(self) -> str:
        """The batch's id, or its part's (``shared.stores.dispatcher.dispatch_unit``)."""
        return dispatch_unit(self.batch_id, self.part)

    @property
    def order_key(self) -> str:
        return dispatch_order_key(self.batch_id, self.part)

    @cached_property
    def message_defaults(self) -> RequestDefaults | None:
        """The defaults as each request message carries them (computed once per batch)."""
        return message_defaults(self.defaults)

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.position.sent) if not self.position.done else 0

    def dispatchable(self, now: float) -> bool:
        return self.status == "in_progress" and self.expires_at > now

    def queued(self, at_risk: bool = False) -> QueuedBatch:
        return QueuedBatch(
            batch_id=self.unit,
            project=self.project,
            remaining=self.remaining,
            priority=self.priority,
            expires_at=self.expires_at,
            started=self.started,
            order=self.order,
            at_risk=at_risk,
        )

    def advance(self, now: float) -> None:
        """Every line read is on Kafka: the position moves past them."""
        assert self.cursor is not None
        self.position.sent, self.skipped = self.position.sent + self.skipped, 0
        self.position.line, self.position.byte = self.cursor.line, self.cursor.byte
        # Done at the end of the file, or once every request line went (trailing blanks).
        self.position.done = self.cursor.exhausted or self.position.sent >= self.total
        self.started = self.dirty = True
        self.rate.mark(now, self.position.sent)

    def open_cursor(self, store: ObjectStore) -> InputCursor | OrderCursor:
        """The cursor at the batch's position: in its dispatch order, or in file order."""
        if self.cursor is None:
            p = self.position
            self.cursor = (
                OrderCursor(store, self.order_key, p.line, p.byte)
                if self.ordered
                else InputCursor(store, self.object_key, p.line, p.byte)
            )
        return self.cursor

    async def take_unanswered(self, cursor: InputCursor | OrderCursor, count: int) -> list[InputLine]:
        """Up to ``count`` lines to send from ``cursor``, passing over answered lines (counted
        in ``skipped``; the position counts them as sent once the round's lines are on Kafka)."""
        if self.answered is None:
            return await cursor.take(count)
        taken: list[InputLine] = []
        placed: dict[int, Any] = {}
        # At most SKIP_PER_ROUND passed over per round: the position moves on, the next round
        # goes on from there, and the dispatcher's other work (its lease) is not held up.
        while len(taken) < count and self.skipped < SKIP_PER_ROUND:
            lines = await cursor.take(count - len(taken))
            if not lines:
                break
            if isinstance(cursor, OrderCursor):
                placed.update(cursor.placed)
            for line in lines:
                if line.number in self.answered:
                    self.skipped += 1
                else:
                    taken.append(line)
        if isinstance(cursor, OrderCursor):
            cursor.placed = placed  # each call replaced it: the lines taken keep their places
        return taken

    def sent_before(self, store: ObjectStore, upto_line: int, upto_byte: int) -> AsyncGenerator[InputLine]:
        """The lines sent before a position (a takeover's check of an earlier dispatcher's)."""
        if self.ordered:
            return scan_order(store, self.order_key, upto_line)
        return scan(store, self.object_key, upto_line, upto_byte)

    async def close_cursor(self) -> None:
        cursor, self.cursor = self.cursor, None
        if cursor is not None:
            await cursor.close()


@dataclass
class ModelState:
    """One model: its topic's backlog, the journey of its lines, its queue's policy, the lease."""

    topic: str
    backlog: Backlog
    book: JourneyBook
    policy: FairSharePolicy
    affinity: Affinity
    partitions: int = 0
    metered_at: float = 0.0
    held_at: float | None = None  # last lease renewal; None: not held
    failures: int = 0  # rounds in a row that failed for this model
    retry_at: float = 0.0  # after a failure, the model's next round is not before this

    @classmethod
    def new(cls, topic: str, s: DispatchSettings) -> ModelState:
        """A model the dispatcher has just met: nothing sent, nothing metered, no lease."""
        return cls(
            topic=topic,
            backlog=Backlog(
                s.worker_window,
                s.backlog_seconds,
                s.min_backlog,
                s.direct_weight,
                commit_lag_s=s.commit_lag_s,
                max_backlog=s.max_backlog,
            ),
            book=JourneyBook(s.grace_s, s.max_attempts, s.takeover_grace_s),
            affinity=Affinity(s.affinity_slice_lines, s.affinity_slack_lines),
            policy=FairSharePolicy(
                weights=s.weights(),
                default_weight=s.default_project_weight,
                tiers=s.tiers(),
                quantum=s.quantum_lines,
                start_lines=s.start_lines,
            ),
        )

    def record(self, sending: Sending, partition: int, offset: int) -> None:
        """A send was acknowledged at ``partition``/``offset``."""
        self.backlog.produced(partition, offset)
        self.book.sent(
            SentLine(
                batch_id=sending.batch.batch_id,
                line=sending.line.number,
                start=sending.line.start,
                length=len(sending.line.raw),
                partition=partition,
                offset=offset,
                attempt=sending.attempt,
            )
        )


@dataclass
class Sending:
    """A line handed to the producer, until its acknowledgement."""

    batch: QueuedState
    line: InputLine
    attempt: int = 1
