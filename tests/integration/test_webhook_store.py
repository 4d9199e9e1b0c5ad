"""The webhook outbox against the MongoDB-wire stand-in (SecantusDB): recorded once per batch and
type, only for projects with an endpoint, and an attempt claimed by one deliverer at a time."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest

from deploy.local.stack import Stack
from shared.documents import BatchDocument
from shared.mongo import Mongo
from shared.protocol.openai import BatchError
from shared.settings import MongoSettings, WebhookEndpoint
from shared.stores.batches import BatchStore
from shared.stores.webhooks import WebhookEventStore
from shared.webhooks import EventRecorder

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture(scope="module")
async def mongo(stand_ins: Stack) -> AsyncIterator[Mongo]:
    database = f"webhooks_{uuid.uuid4().hex[:8]}"
    db = Mongo(MongoSettings(uri=stand_ins.env()["BATCHSTREAM_MONGO_URI"], database=database))
    yield db
    await db.client.drop_database(database)
    await db.close()


@pytest.fixture
def events(mongo: Mongo) -> WebhookEventStore:
    return WebhookEventStore(mongo.webhook_events)


@pytest.fixture
def batches(mongo: Mongo, events: WebhookEventStore) -> BatchStore:
    endpoints = {"hooked": WebhookEndpoint(url="http://127.0.0.1:1/hooks", secret=SECRET)}
    return BatchStore(mongo.batches, on_end=EventRecorder(events, endpoints).batch_ended)


async def new_batch(store: BatchStore, project: str, status: str = "in_progress") -> str:
    batch_id = f"batch_{uuid.uuid4().hex[:24]}"
    now = int(time.time())
    await store.insert(
        BatchDocument.model_validate(
            {
                "_id": batch_id,
                "project": project,
                "endpoint": "/v1/chat/completions",
                "input_file_id": "file-in",
                "status": status,
                "created_at": now,
                "expires_at": now + 86400,
            }
        )
    )
    return batch_id


async def finish(store: BatchStore, batch_id: str) -> bool:
    counts = {"total": 1, "completed": 1, "failed": 0}
    return await store.finish(
        batch_id, "completed", output_file_id="file-out", error_file_id=None, request_counts=counts, usage={}
    )


async def test_a_batch_that_ends_records_its_event_once(
    batches: BatchStore, events: WebhookEventStore
) -> None:
    batch_id = await new_batch(batches, "hooked")
    assert await finish(batches, batch_id)
    assert not await finish(batches, batch_id)  # already terminal: no move, no second event
    batch = await batches.get(batch_id)
    assert batch is not None
    await batches.announce_end(batch)  # a finalize repeated after a crash
    event = await events.get(f"evt_{batch_id}_batch.completed")
    assert event is not None and event.status == "pending" and event.attempts == 0
    assert (event.project, event.type, event.batch_id) == ("hooked", "batch.completed", batch_id)
    assert await events.pending() == 1


async def test_failed_at_validation_records_batch_failed(
    batches: BatchStore, events: WebhookEventStore
) -> None:
    batch_id = await new_batch(batches, "hooked", status="validating")
    assert await batches.fail(batch_id, [BatchError(code="invalid_json_line", message="bad")])
    assert await events.get(f"evt_{batch_id}_batch.failed") is not None


async def test_a_project_without_an_endpoint_records_nothing(
    batches: BatchStore, events: WebhookEventStore
) -> None:
    batch_id = await new_batch(batches, "unhooked")
    assert await finish(batches, batch_id)
    assert await events.get(f"evt_{batch_id}_batch.completed") is None


async def test_an_attempt_is_claimed_by_one_deliverer_until_its_lease_ends(
    batches: BatchStore, events: WebhookEventStore, mongo: Mongo
) -> None:
    await mongo.webhook_events.delete_many({})
    batch_id = await new_batch(batches, "hooked")
    assert await finish(batches, batch_id)
    now = time.time() + 1
    first = await events.claim(now, lease_s=30)
    assert first is not None and first.attempts == 1
    assert await events.claim(now, lease_s=30) is None  # leased: a second deliverer gets nothing
    later = now + 31  # the first deliverer died mid-attempt: the lease ran out
    second = await events.claim(later, lease_s=30)
    assert second is not None and second.attempts == 2 and second.lease_token != first.lease_token
    await events.delivered(first, later)  # the stale holder's outcome is not written
    assert (await events.get(first.id)).status == "pending"  # type: ignore[union-attr]
    await events.delivered(second, later)
    assert (await events.get(first.id)).status == "delivered"  # type: ignore[union-attr]
    assert await events.claim(later + 100, lease_s=30) is None
