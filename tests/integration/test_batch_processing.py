"""No poison batch: whatever goes wrong while one batch is validated or emitted stays with it.

The api's batch service runs here against the stand-in servers (MongoDB, S3) with an emitter fake
that fails every publish: the batch is retried a bounded number of times, then ends ``failed``
with an error that names what happened; a batch whose processing never ended across restarts
ends ``failed`` on the next start instead of being retried forever.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from deploy.local.stack import Stack
from services.api.dispatch.settings import DispatchSettings
from services.api.schemas import BatchCreateParams
from services.api.service.batches import BatchService
from services.api.service.files import FileService
from shared.documents import BatchDocument
from shared.mongo import Mongo
from shared.protocol.messages import ControlMessage
from shared.settings import ApiSettings
from shared.storage import ObjectStore
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore
from shared.stores.idempotency import IdempotencyStore
from shared.stores.models import ModelStore
from tests.support.fakes import FakeDispatcher
from tests.support.fresh_mongo import fresh_mongo
from tests.support.waiting import eventually

MODEL = "poison-test-model"


class FailingEmitterFake:
    """Announcing a validated batch always raises; cancellations are recorded."""

    def __init__(self) -> None:
        self.failed_announcements = 0
        self.announced: list[ControlMessage] = []

    async def announce(self, message: ControlMessage) -> None:
        if not message.cancelled:
            self.failed_announcements += 1
            raise RuntimeError("boom while announcing")
        self.announced.append(message)


@pytest.fixture(scope="module")
async def mongo(stand_ins: Stack) -> AsyncIterator[Mongo]:
    async with fresh_mongo(stand_ins, "processing") as db:
        await db.models.update_one({"_id": MODEL}, {"$set": {"max_context_length": 4096}}, upsert=True)
        yield db


@pytest.fixture
async def service(stand_ins: Stack, mongo: Mongo) -> AsyncIterator[tuple[BatchService, FailingEmitterFake]]:
    store = ObjectStore(stand_ins.storage_settings())
    settings = ApiSettings(process_attempts=2, process_retry_wait_s=0.01, process_max_starts=3)
    batches = BatchStore(mongo.batches)
    files = FileService(FileStore(mongo.files), batches, store, settings)
    emitter = FailingEmitterFake()
    service = BatchService(
        batches,
        ModelStore(mongo.models),
        IdempotencyStore(mongo.idempotency),
        store,
        files,
        emitter,  # type: ignore[arg-type]
        FakeDispatcher(),  # type: ignore[arg-type]
        settings,
        DispatchSettings(),
    )
    yield service, emitter
    await service.shutdown()


def request_line(custom_id: str) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    }


async def ended(batches: BatchStore, batch_id: str) -> BatchDocument:
    async def probe() -> BatchDocument | None:
        batch = await batches.get(batch_id)
        return batch if batch is not None and batch.status == "failed" else None

    return await eventually(probe, 30, f"batch {batch_id} to fail")


async def test_a_batch_that_keeps_failing_ends_failed_saying_why(
    service: tuple[BatchService, FailingEmitterFake],
) -> None:
    batches, emitter = service
    data = "\n".join(json.dumps(request_line(f"c{i}")) for i in range(3)).encode()
    upload = await batches.files.upload("p", io.BytesIO(data), len(data), "in.jsonl", "batch")
    created = await batches.create(
        "p", BatchCreateParams(input_file_id=upload.id, metadata={"n": str(uuid.uuid4())})
    )
    failed = await ended(batches.batches, created.id)
    assert emitter.failed_announcements == 2  # process_attempts, then no more
    assert failed.errors is not None
    (error,) = failed.errors.data
    assert error.code == "processing_failed" and "RuntimeError: boom while announcing" in error.message
    assert failed.public().error == error
    assert any(m.batch_id == created.id and m.cancelled for m in emitter.announced)


async def test_a_batch_never_finished_across_restarts_fails_on_the_next_start(
    service: tuple[BatchService, FailingEmitterFake], mongo: Mongo
) -> None:
    batches, emitter = service
    now = int(time.time())
    stuck = BatchDocument(
        _id=f"batch_{uuid.uuid4().hex[:24]}",
        endpoint="/v1/chat/completions",
        input_file_id="file-gone",
        status="validating",
        created_at=now,
        expires_at=now + 86400,
        attempts=3,  # process_max_starts: three starts already ended without an answer
    )
    await batches.batches.insert(stuck)
    await batches.recover()
    failed = await ended(batches.batches, stuck.id)
    assert failed.errors is not None and failed.errors.data[0].code == "processing_failed"
    assert "started 3 times" in failed.errors.data[0].message
    assert emitter.failed_announcements == 0
