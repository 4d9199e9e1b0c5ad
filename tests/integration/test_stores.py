"""The batch and file stores against the MongoDB-wire stand-in (SecantusDB).

Each status change is a conditional update guarded by the lifecycle: these tests check that a
move from an allowed status lands, that a racing writer cannot move a terminal batch, and that the
reads the api and the aggregator make (project scope, paging, overdue, files a batch reads) hold.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from deploy.local.stack import Stack
from shared.documents import BatchDocument, FileDocument
from shared.mongo import Mongo
from shared.protocol.openai import BatchError, FileObject, ModelCard
from shared.seen_lines import SeenLines
from shared.stores.batch_progress import BatchProgressStore, LiveCounts
from shared.stores.batches import MIXED, BatchStore
from shared.stores.dispatcher import DispatchQueueStore
from shared.stores.files import FileStore
from shared.stores.models import WORKER_FORGOTTEN_S, ModelStore
from tests.support.fresh_mongo import fresh_mongo


@pytest.fixture(scope="module")
async def mongo(stand_ins: Stack) -> AsyncIterator[Mongo]:
    async with fresh_mongo(stand_ins, "stores") as db:
        yield db


@pytest.fixture
def batches(mongo: Mongo) -> BatchStore:
    return BatchStore(mongo.batches)


@pytest.fixture
def progress(mongo: Mongo) -> BatchProgressStore:
    return BatchProgressStore(mongo.batches)


@pytest.fixture
def queue(mongo: Mongo) -> DispatchQueueStore:
    return DispatchQueueStore(mongo.batches)


@pytest.fixture
def files(mongo: Mongo) -> FileStore:
    return FileStore(mongo.files)


async def new_batch(store: BatchStore, project: str = "p", **fields: object) -> BatchDocument:
    now = int(time.time())
    values: dict[str, object] = {
        "_id": f"batch_{uuid.uuid4().hex[:24]}",
        "project": project,
        "endpoint": "/v1/chat/completions",
        "input_file_id": "file-in",
        "status": "validating",
        "created_at": now,
        "expires_at": now + 86400,
        "sort_key": time.time_ns(),
    }
    values.update(fields)
    batch = BatchDocument.model_validate(values)
    await store.insert(batch)
    return batch


async def test_a_batch_runs_through_its_lifecycle(batches: BatchStore, progress: BatchProgressStore) -> None:
    batch = await new_batch(batches)
    assert await batches.start(batch.id, "m", 3)
    assert await progress.live_counts({batch.id: LiveCounts(2, 1, {"total_tokens": 7})}) == 1
    assert await batches.finalizing(batch.id)
    ended = await batches.finish(
        batch.id,
        "completed",
        output_file_id="file-out",
        error_file_id="file-err",
        request_counts={"total": 3, "completed": 2, "failed": 1},
        usage={"total_tokens": 7},
    )
    assert ended
    stored = await batches.get(batch.id)
    assert stored is not None
    assert stored.status == "completed" and stored.model == "m"
    assert stored.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    assert stored.in_progress_at and stored.finalizing_at and stored.completed_at
    public = stored.public()
    assert public.id == batch.id and public.output_file_id == "file-out"


async def test_a_terminal_batch_cannot_be_moved(batches: BatchStore, progress: BatchProgressStore) -> None:
    batch = await new_batch(batches)
    assert await batches.fail(batch.id, [BatchError(code="empty_file", message="empty")])
    assert not await batches.start(batch.id, "m", 3)  # a late validator loses
    assert not await batches.request_cancel(batch.id)
    assert not await batches.finalizing(batch.id)
    done = {"output_file_id": None, "error_file_id": None, "request_counts": {}, "usage": {}}
    assert not await batches.finish(batch.id, "expired", **done)
    assert await progress.live_counts({batch.id: LiveCounts(5, 0, {})}) == 1  # sent, but not applied
    stored = await batches.get(batch.id)
    assert stored is not None and stored.status == "failed"
    assert stored.errors is not None and stored.errors.data[0].code == "empty_file"
    assert stored.request_counts.completed == 0


async def test_a_cancel_moves_an_open_batch_once(batches: BatchStore) -> None:
    batch = await new_batch(batches)
    assert await batches.start(batch.id, "m", 2)
    assert await batches.request_cancel(batch.id)
    assert not await batches.request_cancel(batch.id)  # already cancelling
    assert not await batches.finalizing(batch.id)  # finalizing only from in_progress
    done = {"output_file_id": None, "error_file_id": None, "request_counts": {"total": 2}, "usage": {}}
    assert await batches.finish(batch.id, "cancelled", **done)
    stored = await batches.get(batch.id)
    assert stored is not None and stored.status == "cancelled" and stored.cancelling_at


async def test_reads_are_scoped_to_the_project_and_page_newest_first(batches: BatchStore) -> None:
    project = f"proj-{uuid.uuid4().hex[:6]}"
    made = [await new_batch(batches, project) for _ in range(3)]
    other = await new_batch(batches, "someone-else")
    assert await batches.get(other.id, project) is None
    assert await batches.get(made[0].id, project) is not None
    first = await batches.page(project, None, 2)
    assert [b.id for b in first] == [made[2].id, made[1].id]
    rest = await batches.page(project, first[-1].sort_key, 2)
    assert [b.id for b in rest] == [made[0].id]


async def test_overdue_finds_expired_and_stuck_cancels(
    batches: BatchStore, progress: BatchProgressStore
) -> None:
    now = time.time()
    expired = await new_batch(batches, status="in_progress", expires_at=int(now) - 1)
    running = await new_batch(batches, status="in_progress")
    cancelling = await new_batch(batches, status="cancelling", cancelling_at=int(now) - 120)
    done = await new_batch(batches, status="completed", expires_at=int(now) - 1)
    # A finalize that never ended (its aggregator's state was reset), and one that just began.
    left_finalizing = await new_batch(batches, status="finalizing", finalizing_at=int(now) - 120)
    finalizing = await new_batch(batches, status="finalizing", finalizing_at=int(now))
    found = set(await progress.overdue(now, 60, 1000))
    assert {expired.id, cancelling.id, left_finalizing.id} <= found
    assert not {running.id, done.id, finalizing.id} & found


async def test_resume_and_unfinished_work(
    batches: BatchStore, progress: BatchProgressStore, queue: DispatchQueueStore
) -> None:
    batch = await new_batch(batches, status="in_progress", emitted=True, request_counts={"total": 9})
    await progress.live_counts({batch.id: LiveCounts(4, 1, {})})
    assert batch.id in await progress.in_progress_ids()
    answered = SeenLines()
    for line in (1, 2, 5):
        answered.add(line)
    usage = {"input_tokens": 6, "output_tokens": 3, "total_tokens": 9}
    await progress.resume(batch.id, LiveCounts(2, 1, usage, answered.compressed()))
    stored = await batches.get(batch.id)
    assert stored is not None and not stored.emitted and stored.resumed
    assert (stored.request_counts.completed, stored.request_counts.failed) == (2, 1)
    assert stored.usage.output_tokens == 3
    assert [n for n in range(1, 10) if n in SeenLines.from_compressed(stored.seen_lines)] == [1, 2, 5]
    assert batch.id in await progress.resumed_ids()
    summary = await progress.summary(batch.id)
    assert summary is not None and summary.resumed
    assert batch.id in {b.id for b in await batches.unfinished_work()}
    await batches.mark_dispatchable(batch.id)  # handed to the dispatcher: the api's work is done
    assert batch.id not in {b.id for b in await batches.unfinished_work()}
    assert next(v for v in await queue.views() if v.batch_id == batch.id).resumed
    assert await batches.count_attempt(batch.id) == 1
    assert await batches.count_attempt(batch.id) == 2


async def test_files_visibility_and_the_batches_that_read_them(files: FileStore, batches: BatchStore) -> None:
    file_id = f"file-{uuid.uuid4().hex[:24]}"
    public = FileObject(
        id=file_id, bytes=3, created_at=int(time.time()), filename="in.jsonl", purpose="batch"
    )
    await files.insert(FileDocument.of(public, "p", f"files/{file_id}"))
    assert (await files.visible("p", file_id)) is not None
    assert await files.visible("q", file_id) is None
    reader = await new_batch(batches, input_file_id=file_id)
    assert await batches.reads_file(file_id)
    await files.hide(file_id)
    assert await files.visible("p", file_id) is None
    assert (await files.hidden(file_id)) is not None
    await batches.fail(reader.id, [])
    assert not await batches.reads_file(file_id)
    await files.remove_hidden(file_id)
    assert await files.get(file_id) is None


async def test_an_output_file_upsert_keeps_its_first_creation_time(files: FileStore) -> None:
    file_id = f"file-{uuid.uuid4().hex[:24]}"
    first = FileObject(id=file_id, bytes=1, created_at=100, filename="o.jsonl", purpose="batch_output")
    await files.upsert(FileDocument.of(first, "p", "k"))
    again = first.model_copy(update={"bytes": 2, "created_at": 200})
    await files.upsert(FileDocument.of(again, "p", "k"))
    stored = await files.get(file_id)
    assert stored is not None and stored.bytes == 2 and stored.created_at == 100


async def test_an_end_whose_listener_never_ran_is_found_and_announced_once(mongo: Mongo) -> None:
    """The process that ended a batch is killed between the move and its end listener (the
    webhook event recorder): the batch is marked, found once its end is old enough, and announced."""
    announced: list[tuple[str, str, str]] = []

    async def killed_first(batch_id: str, project: str, status: str) -> None:
        raise RuntimeError("killed before the event was recorded")

    async def recorder(batch_id: str, project: str, status: str) -> None:
        announced.append((batch_id, project, status))

    dying = BatchStore(mongo.batches, SimpleNamespace(batch_ended=killed_first))  # type: ignore[arg-type]
    sweeping = BatchStore(mongo.batches, SimpleNamespace(batch_ended=recorder))  # type: ignore[arg-type]
    lost = await new_batch(dying, project="hooks")
    with pytest.raises(RuntimeError):
        await dying.fail(lost.id, [BatchError(code="invalid_json_line", message="bad", line=1)])
    recorded = await new_batch(sweeping, project="hooks")
    assert await sweeping.fail(recorded.id, [BatchError(code="x", message="y")])
    assert announced == [(recorded.id, "hooks", "failed")]

    assert await sweeping.unrecorded_ends(time.time() - 60, 100) == []  # not old enough yet
    missed = await sweeping.unrecorded_ends(time.time() + 1, 100)
    assert [b.id for b in missed] == [lost.id]
    await sweeping.announce_end(missed[0])
    assert announced[-1] == (lost.id, "hooks", "failed")
    assert await sweeping.unrecorded_ends(time.time() + 1, 100) == []


async def test_the_progress_history_is_kept_per_flush_and_bounded(
    batches: BatchStore, monkeypatch: pytest.MonkeyPatch, progress: BatchProgressStore
) -> None:
    monkeypatch.setattr("shared.stores.batch_progress.PROGRESS_SAMPLES", 3)
    batch = await new_batch(batches, status="in_progress", request_counts={"total": 9})
    for done in range(1, 6):
        await progress.live_counts({batch.id: LiveCounts(done, done // 2, {})})
    total, samples = await batches.progress(batch.id, "p") or (0, [])
    assert total == 9
    assert [(s[1], s[2]) for s in samples] == [(3, 1), (4, 2), (5, 2)]  # the newest three, oldest first
    assert samples[0][0] <= samples[-1][0] <= time.time()
    assert await batches.progress(batch.id, "another-project") is None


async def test_running_lines_and_usage_are_summed_per_model_for_the_project(batches: BatchStore) -> None:
    project = f"usage-{uuid.uuid4().hex[:8]}"
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 5,
        "total_tokens": 15,
    }
    counts = {"total": 10, "completed": 6, "failed": 1}
    await new_batch(batches, project, model="m1", status="in_progress", request_counts=counts, usage=usage)
    await new_batch(
        batches, project, model="m1", status="completed", request_counts={"total": 3, "completed": 3}
    )
    await new_batch(batches, project, model="m2", status="validating")
    await new_batch(batches, "someone-else", model="m1", status="in_progress", request_counts={"total": 50})
    # A mixed batch whose first line names m1: its own row, not m1's.
    mixed = {"total": 4, "completed": 1, "failed": 1}
    await new_batch(
        batches,
        project,
        model="m1",
        mixed_models=True,
        status="in_progress",
        request_counts=mixed,
        usage=usage,
    )
    assert await batches.running_by_model(project) == {"m1": (1, 3), "m2": (1, 0), MIXED: (1, 2)}
    rows = await batches.usage_by_day(project, int(time.time()) - 86_400)
    by_model = {r["model"]: r for r in rows}
    assert set(by_model) == {"m1", "m2", MIXED}
    assert (by_model[MIXED]["batches"], by_model[MIXED]["total"]) == (1, 15)
    m1 = by_model["m1"]
    assert (m1["batches"], m1["completed"], m1["failed"]) == (2, 9, 1)
    assert (m1["input"], m1["cached"], m1["output"], m1["total"]) == (10, 4, 5, 15)
    assert m1["day"] == int(time.time()) // 86_400 * 86_400
    assert await batches.usage_by_day(project, int(time.time()) + 86_400) == []


async def test_a_heartbeat_lists_its_worker_and_forgets_long_silent_ones(mongo: Mongo) -> None:
    models = ModelStore(mongo.models)
    model = f"model-{uuid.uuid4().hex[:8]}"
    await models.beat(model, "host:1", 2048, ["/v1/chat/completions"])
    created = (await models.card(model) or ModelCard(id="", created=-1)).created
    await mongo.models.update_one(
        {"_id": model}, {"$set": {"workers.0.last_seen": time.time() - WORKER_FORGOTTEN_S - 1}}
    )
    await models.beat(model, "host:2", 2048, ["/v1/chat/completions"])
    await models.beat(model, "host:2", 4096, ["/v1/chat/completions"])
    doc = next(d for d in await models.documents() if d["_id"] == model)
    assert [w["id"] for w in doc["workers"]] == ["host:2"]
    assert doc["max_context_length"] == 4096 and doc["endpoints"] == ["/v1/chat/completions"]
    card = await models.card(model)
    assert card is not None and card.created == created  # set by the first heartbeat only
