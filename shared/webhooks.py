"""Batch events for webhooks: their types, ids and bodies, the recorder, the retry schedule.

Transactional-outbox style: a batch store that ends a batch calls :class:`EventRecorder` right
after its guarded status change (``shared/stores/batches.py``), which records one event document
per batch and type (deterministic id, upserted, so a repeated finalize records it once) when the
batch's project has an endpoint. The aggregator's deliverer (``services/aggregator/webhooks.py``)
sends recorded events, so nothing that ends a batch ever waits on a receiver.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import orjson

from shared.documents import WebhookEventDocument
from shared.lifecycle import BatchStatus
from shared.settings import WebhookEndpoint
from shared.stores.webhooks import WebhookEventStore

EVENT_TYPES: dict[str, str] = {
    "completed": "batch.completed",
    "failed": "batch.failed",
    "expired": "batch.expired",
    "cancelled": "batch.cancelled",
}


def event_id(batch_id: str, event_type: str) -> str:
    """``evt_<batch id>_<type>``: the same on every recording, so the event is stored once."""
    return f"evt_{batch_id}_{event_type}"


def event_body(event: WebhookEventDocument) -> bytes:
    """The body OpenAI's batch webhooks send: the same bytes on every attempt."""
    return orjson.dumps(
        {
            "id": event.id,
            "object": "event",
            "type": event.type,
            "created_at": event.created_at,
            "data": {"id": event.batch_id},
        }
    )


def retry_wait(
    attempts: int, first_s: float, max_s: float, rand: Callable[[], float] = random.random
) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: exponential, capped,
    "equal jitter" (between half and all of ``first_s * 2**(attempts-1)``), so receivers that
    come back are not hit by every sender at once and the wait still grows."""
    base = min(max_s, first_s * 2 ** max(attempts - 1, 0))
    return base / 2 + rand() * base / 2


class EventRecorder:
    """Records a batch's terminal event when its project has a webhook endpoint."""

    def __init__(self, events: WebhookEventStore, endpoints: dict[str, WebhookEndpoint]) -> None:
        self._events = events
        self._projects = frozenset(endpoints)

    async def batch_ended(self, batch_id: str, project: str, status: BatchStatus) -> None:
        event_type = EVENT_TYPES.get(status)
        if event_type is None or project not in self._projects:
            return
        now = time.time()
        await self._events.record(
            WebhookEventDocument(
                _id=event_id(batch_id, event_type),
                project=project,
                type=event_type,
                batch_id=batch_id,
                created_at=int(now),
                next_attempt_at=now,
            )
        )
