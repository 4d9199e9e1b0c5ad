"""What the dispatcher keeps in memory: per batch it may dispatch, per model, per line being sent."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from services.api.dispatch.journey import JourneyBook, SentLine
from services.api.dispatch.meter import Backlog
from services.api.dispatch.policy import FairSharePolicy, QueuedBatch
from services.api.dispatch.positions import Position
from services.api.dispatch.reader import InputCursor, InputLine
from shared.protocol.messages import SamplingDefaults


@dataclass
class QueuedState:
    """One batch the dispatcher may send lines of."""

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
    emitted: bool = False
    settled: bool = False  # cancelling, and every line sent came back (dispatch_settled)
    started: bool = False
    cursor: InputCursor | None = None
    dirty: bool = False  # the position moved since it was saved
    saved_at: float = 0.0

    @classmethod
    def from_document(cls, doc: dict[str, Any], object_key: str, position: Position) -> QueuedState:
        return cls(
            batch_id=doc["_id"],
            model=doc["model"],
            project=str(doc.get("project") or "default"),
            status=doc["status"],
            total=int((doc.get("request_counts") or {}).get("total") or 0),
            priority=int(doc.get("priority") or 0),
            expires_at=float(doc.get("expires_at") or float("inf")),
            order=int(doc.get("sort_key") or 0),
            object_key=object_key,
            defaults=SamplingDefaults.model_validate(doc.get("defaults") or {}),
            position=position,
            emitted=bool(doc.get("emitted")),
            started=position.sent > 0,
        )

    @cached_property
    def defaults_json(self) -> dict[str, Any]:
        """The defaults as each request message carries them (computed once per batch)."""
        return self.defaults.model_dump()

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.position.sent) if not self.position.done else 0

    def dispatchable(self, now: float) -> bool:
        return self.status == "in_progress" and self.expires_at > now

    def queued(self) -> QueuedBatch:
        return QueuedBatch(
            batch_id=self.batch_id,
            project=self.project,
            remaining=self.remaining,
            priority=self.priority,
            expires_at=self.expires_at,
            started=self.started,
            order=self.order,
        )

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
    partitions: int = 0
    metered_at: float = 0.0
    held_at: float | None = None  # last lease renewal; None: not held

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
    future: asyncio.Future[Any]
    attempt: int = 1
