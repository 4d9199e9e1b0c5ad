"""The webhook outbox against the MongoDB-wire stand-in (SecantusDB): recorded once per batch and
type, only for projects with an endpoint, even when recording failed once after the move, and an
attempt claimed by one deliverer at a time."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from deploy.local.stack import Stack
from services.api.dispatch.settings import DispatchSettings
from services.api.schemas import BatchCreateParams
from services.api.service.batches import BatchService
from services.api.service.files import FileService
from shared.documents import BatchDocument
from shared.lifecycle import BatchStatus
from shared.mongo import Mongo
from shared.protocol.openai import BatchError
from shared.settings import ApiSettings, WebhookEndpoint
from shared.storage import ObjectStore
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore
from shared.stores.idempotency import IdempotencyStore
from shared.stores.models import ModelStore
from shared.stores.webhooks import WebhookEventStore
from shared.webhooks import EventRecorder
from tests.support.fakes import FakeDispatcher
from tests.support.fresh_mongo import fresh_mongo
from tests.support.waiting import eventually

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture(scope="module")
async def mongo(stand_ins: Stack) -> AsyncIterator[Mongo]:
    async with fresh_mongo(stand_ins, "webhooks") as db:
        yield db


@pytest.fixture
def events(mongo: Mongo) -> WebhookEventStore:
    return WebhookEventStore(mongo.webhook_events)


@pytest.fixture
def batches(mongo: Mongo, events: WebhookEventStore) -> BatchStore:
    endpoints = {"hooked": WebhookEndpoint(url="http://127.0.0.1:1/hooks", secret=SECRET)}
    return BatchStore(mongo.batches, EventRecorder(events, endpoints))


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


class RecorderFailingOnceFake:
    """The event recorder, but its first call fails (MongoDB hiccups right after the move)."""

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder
        self.calls = 0

    async def batch_ended(self, batch_id: str, project: str, status: BatchStatus) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("webhook_events unavailable")
        await self.recorder.batch_ended(batch_id, project, status)


async def test_batch_failed_is_recorded_when_recording_failed_once_after_the_move(
    stand_ins: Stack, mongo: Mongo, events: WebhookEventStore
) -> None:
    endpoints = {"hooked": WebhookEndpoint(url="http://127.0.0.1:1/hooks", secret=SECRET)}
    flaky = RecorderFailingOnceFake(EventRecorder(events, endpoints))
    batches = BatchStore(mongo.batches, flaky)
    store = ObjectStore(stand_ins.storage_settings())
    settings = ApiSettings(process_attempts=3, process_retry_wait_s=0.01)
    files = FileService(FileStore(mongo.files), batches, store, settings)
    service = BatchService(
        batches,
        ModelStore(mongo.models),
        IdempotencyStore(mongo.idempotency),
        store,
        files,
        None,  # type: ignore[arg-type]
        FakeDispatcher(),  # type: ignore[arg-type]
        settings,
        DispatchSettings(),
    )
    try:
        data = b"this is not json\n"
        upload = await files.upload("hooked", io.BytesIO(data), len(data), "in.jsonl", "batch")
        created = await service.create("hooked", BatchCreateParams(input_file_id=upload.id))
        event = await eventually(
            lambda: events.get(f"evt_{created.id}_batch.failed"), 30, "the batch.failed event"
        )
    finally:
        await service.shutdown()
        store.close()
    assert flaky.calls == 2 and event.status == "pending"
    batch = await batches.get(created.id)
    assert batch is not None and batch.status == "failed"
