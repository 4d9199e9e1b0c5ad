"""The ``batches`` collection's records and status changes: the api's reads and writes of a
batch document, the quotas' and the console's views, and every move of a batch's status.

Two more stores own the fields of one role each: the dispatcher's (``dispatcher.py``) and
the aggregator's (``batch_progress.py``).

Status changes are named operations (start, fail, request_cancel, finalizing, finish) guarded by
the lifecycle: each is one conditional update on the statuses the move may start from
(:func:`shared.lifecycle.sources`), so a racing writer can never move a batch that already left
them, and each returns whether it moved the batch. A move to a terminal status records the
batch's webhook event (``EventRecorder.batch_ended``, ``shared/webhooks.py``) right after it
succeeds, so every way a batch ends records its event where the batch ends.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pymongo import DESCENDING
from pymongo.asynchronous.collection import AsyncCollection

from shared import lifecycle
from shared.documents import BatchDocument
from shared.lifecycle import BatchStatus
from shared.protocol.openai import BatchError, BatchErrors

Document = dict[str, Any]


@dataclass(frozen=True)
class EnqueuedBatch:
    """What the api's quotas read of an unfinished batch (services/api/quotas)."""

    batch_id: str
    total: int
    done: int  # lines with a result (completed + failed)
    enqueued: Mapping[str, Mapping[str, int]]  # model -> {lines, tokens}, set at validation
    enqueued_at: int  # nanoseconds, when it was set


def _now() -> int:
    return int(time.time())


class EndRecorder(Protocol):
    """Records an ended batch's webhook event: ``shared.webhooks.EventRecorder``."""

    async def batch_ended(self, batch_id: str, project: str, status: BatchStatus) -> None: ...


class BatchStore:
    def __init__(self, collection: AsyncCollection[Document], events: EndRecorder | None = None) -> None:
        """``events``: records each ended batch's webhook event (None: no events)."""
        self._batches = collection
        self._events = events

    # ---------------------------------------------------------------- reads

    async def insert(self, batch: BatchDocument) -> None:
        await self._batches.insert_one(batch.to_mongo())

    async def get(self, batch_id: str, project: str | None = None) -> BatchDocument | None:
        """The batch, or None; with ``project``, only when that project owns it."""
        query: Document = {"_id": batch_id}
        if project is not None:
            query["project"] = project
        doc = await self._batches.find_one(query, {"progress": 0})
        return BatchDocument.model_validate(doc) if doc is not None else None

    async def exists(self, batch_id: str) -> bool:
        return bool(await self._batches.count_documents({"_id": batch_id}, limit=1))

    async def page(
        self,
        project: str,
        before_sort_key: int | None,
        limit: int,
        statuses: Collection[str] | None = None,
    ) -> list[BatchDocument]:
        """Up to ``limit`` of the project's batches, newest first, older than the anchor if given,
        in one of ``statuses`` if given."""
        query: Document = {"project": project}
        if statuses:
            query["status"] = {"$in": sorted(statuses)}
        if before_sort_key is not None:
            query["sort_key"] = {"$lt": before_sort_key}
        cursor = self._batches.find(query, {"progress": 0, "seen_lines": 0})
        cursor = cursor.sort([("sort_key", DESCENDING), ("_id", DESCENDING)])
        return [BatchDocument.model_validate(d) for d in await cursor.limit(limit).to_list()]

    async def unfinished_work(self) -> list[BatchDocument]:
        """Batches an api process left validating, or validated but not handed to the dispatcher."""
        query = {"$or": [{"status": "validating"}, {"status": "in_progress", "dispatchable": {"$ne": True}}]}
        return [BatchDocument.model_validate(d) async for d in self._batches.find(query)]

    async def reads_file(self, file_id: str) -> bool:
        """True when a batch that is not over yet reads ``file_id`` as its input."""
        query = {"input_file_id": file_id, "status": {"$in": sorted(lifecycle.OPEN)}}
        return bool(await self._batches.count_documents(query, limit=1))

    # ---------------------------------------------------------------- transitions

    async def _move(self, batch_id: str, target: BatchStatus, fields: Document | None = None) -> bool:
        update = {"status": target, f"{target}_at": _now(), **(fields or {})}
        guard = {"_id": batch_id, "status": {"$in": sorted(lifecycle.sources(target))}}
        if self._events is None or target not in lifecycle.TERMINAL:
            result = await self._batches.update_one(guard, {"$set": update})
            return result.modified_count > 0
        # ``end_recorded`` is False from the move until the event is recorded, in the same update
        # as the move: a process killed in between leaves a mark ``unrecorded_ends`` finds.
        update["end_recorded"] = False
        before = await self._batches.find_one_and_update(guard, {"$set": update}, projection={"project": 1})
        if before is None:
            return False
        await self._events.batch_ended(batch_id, str(before.get("project") or "default"), target)
        await self._batches.update_one({"_id": batch_id}, {"$set": {"end_recorded": True}})
        return True

    async def announce_end(self, batch: BatchDocument) -> None:
        """Record the webhook event again for a batch found terminal (a finalize repeated after a
        crash between the move and the recording, or ``unrecorded_ends``; the recorder stores an
        event once)."""
        if self._events is not None and batch.status in lifecycle.TERMINAL:
            await self._events.batch_ended(batch.id, batch.project, batch.status)
            await self._batches.update_one({"_id": batch.id}, {"$set": {"end_recorded": True}})

    async def unrecorded_ends(self, ended_before: float, limit: int) -> list[BatchDocument]:
        """Batches that ended before ``ended_before`` whose event was never recorded (the process
        that moved them was killed first): to be announced again."""
        ended = [{"status": s, f"{s}_at": {"$lt": ended_before}} for s in sorted(lifecycle.TERMINAL)]
        cursor = self._batches.find({"end_recorded": False, "$or": ended}, limit=limit)
        return [BatchDocument.model_validate(doc) async for doc in cursor]

    async def start(
        self,
        batch_id: str,
        model: str | None,
        total: int,
        prefix_order: bool = False,
        parts: list[dict[str, Any]] | None = None,
        enqueued: Mapping[str, Mapping[str, int]] | None = None,
        enqueued_at: int = 0,
        expected_tokens: int | None = None,
    ) -> bool:
        """validating -> in_progress, with the model, the number of request lines, whether a
        dispatch order was made (``services/api/service/dispatch_order.py``), the lines' parts by base
        model, the lines and estimated tokens per model the quotas count (``enqueued``) and the
        lines' expected output tokens (``expected_tokens``; both: ``shared/documents.py``)."""
        fields: Document = {
            "model": model,
            "request_counts.total": total,
            "prefix_order": prefix_order,
            "parts": parts,
            "expected_tokens": expected_tokens,
        }
        if enqueued is not None:
            fields |= {"enqueued": {m: dict(c) for m, c in enqueued.items()}, "enqueued_at": enqueued_at}
        return await self._move(batch_id, "in_progress", fields)

    async def fail(self, batch_id: str, errors: Iterable[BatchError]) -> bool:
        """-> failed, with the errors that say why."""
        listed = BatchErrors(data=list(errors)).model_dump()
        return await self._move(batch_id, "failed", {"errors": listed})

    async def request_cancel(self, batch_id: str) -> bool:
        """-> cancelling (the aggregator ends it ``cancelled``)."""
        return await self._move(batch_id, "cancelling")

    async def finalizing(self, batch_id: str) -> bool:
        """in_progress -> finalizing: every line has a result; the files are being written."""
        return await self._move(batch_id, "finalizing")

    async def finish(
        self,
        batch_id: str,
        status: BatchStatus,
        *,
        output_file_id: str | None,
        error_file_id: str | None,
        request_counts: Mapping[str, int],
        usage: Mapping[str, Any],
        usage_by_model: Mapping[str, Any] | None = None,
        not_run_counts: Mapping[str, int] | None = None,
    ) -> bool:
        """-> a terminal status, with the output and error files and the final counts (and a
        mixed batch's usage per model)."""
        if status not in lifecycle.TERMINAL:
            raise lifecycle.TransitionRefused(f"finish needs a terminal status, not {status!r}")
        fields = {
            "output_file_id": output_file_id,
            "error_file_id": error_file_id,
            "request_counts": dict(request_counts),
            "usage": dict(usage),
        }
        if usage_by_model is not None:
            fields["usage_by_model"] = dict(usage_by_model)
        if not_run_counts is not None:
            fields["not_run_counts"] = dict(not_run_counts)
        return await self._move(batch_id, status, fields)

    # ---------------------------------------------------------------- other writes

    async def mark_dispatchable(self, batch_id: str) -> None:
        """Validated: the api's dispatcher may stream its lines (services/api/dispatch)."""
        await self._batches.update_one({"_id": batch_id}, {"$set": {"dispatchable": True}})

    async def count_attempt(self, batch_id: str) -> int:
        """Count one more processing attempt; returns the attempts so far, this one included."""
        doc = await self._batches.find_one_and_update(
            {"_id": batch_id}, {"$inc": {"attempts": 1}}, projection={"attempts": 1}, return_document=True
        )
        return int((doc or {}).get("attempts") or 0)

    # ---------------------------------------------------------------- quotas (services/api/quotas)

    async def open_counts(self, project: str) -> tuple[int, int]:
        """The project's batches not yet ended and those of them validating."""
        query: Document = {"project": project, "status": {"$in": sorted(lifecycle.OPEN)}}
        unfinished = await self._batches.count_documents(query)
        validating = await self._batches.count_documents({**query, "status": "validating"})
        return unfinished, validating

    async def enqueued(self, project: str) -> list[EnqueuedBatch]:
        """The project's unfinished batches that were validated, with their lines and tokens."""
        query = {"project": project, "status": {"$in": sorted(lifecycle.OPEN)}}
        projection = {"request_counts": 1, "enqueued": 1, "enqueued_at": 1}
        found = []
        async for doc in self._batches.find(query, projection):
            if not doc.get("enqueued"):
                continue  # still validating
            counts = doc.get("request_counts") or {}
            done = int(counts.get("completed") or 0) + int(counts.get("failed") or 0)
            found.append(
                EnqueuedBatch(
                    batch_id=str(doc["_id"]),
                    total=int(counts.get("total") or 0),
                    done=done,
                    enqueued=doc["enqueued"],
                    enqueued_at=int(doc.get("enqueued_at") or 0),
                )
            )
        return found

    async def withdraw(self, batch_id: str) -> None:
        """Remove a batch whose create was refused before it was answered (still validating)."""
        await self._batches.delete_one({"_id": batch_id, "status": "validating"})

    # ---------------------------------------------------------------- views (the console's)

    async def progress(self, batch_id: str, project: str) -> tuple[int, list[list[float]]] | None:
        """The batch's total and its progress samples ``[at, completed, failed]``, oldest first."""
        doc = await self._batches.find_one(
            {"_id": batch_id, "project": project}, {"request_counts.total": 1, "progress": 1}
        )
        if doc is None:
            return None
        return int((doc.get("request_counts") or {}).get("total") or 0), list(doc.get("progress") or [])

    async def _by_model(self, match: Document, group: Document) -> list[Document]:
        """``group`` (its ``_id`` given ``MODEL_KEY`` for the model) over the batches ``match``
        selects: one-model batches by their model, mixed batches together as ``MIXED``."""
        rows = []
        for mixed, model in ((False, {"$ifNull": ["$model", ""]}), (True, {"$literal": MIXED})):
            stages = [{"$match": {**match, "mixed_models": True if mixed else {"$ne": True}}}]
            stages.append({"$group": _with_model(group, model)})
            rows += await (await self._batches.aggregate(stages)).to_list()
        return rows

    async def running_by_model(self, project: str) -> dict[str, tuple[int, int]]:
        """For each model: the project's open batches and their lines still without a result
        (mixed batches together, as ``MIXED``)."""
        match = {"project": project, "status": {"$in": sorted(lifecycle.OPEN)}}
        group: Document = {
            "_id": MODEL_KEY,
            "batches": {"$sum": 1},
            "queued": {
                "$sum": {
                    "$max": [
                        0,
                        {
                            "$subtract": [
                                {"$ifNull": ["$request_counts.total", 0]},
                                {
                                    "$add": [
                                        {"$ifNull": ["$request_counts.completed", 0]},
                                        {"$ifNull": ["$request_counts.failed", 0]},
                                    ]
                                },
                            ]
                        },
                    ]
                }
            },
        }
        rows = await self._by_model(match, group)
        return {str(r["_id"]): (int(r["batches"]), int(r["queued"])) for r in rows if r["_id"]}

    async def usage_by_day(self, project: str, since: int) -> list[Document]:
        """The project's batches created since ``since`` (unix s), summed per model and UTC day:
        ``{day (unix s at 00:00), model, batches, completed, failed, input, cached, output, total}``."""
        day = {"$subtract": ["$created_at", {"$mod": ["$created_at", 86_400]}]}
        match = {"project": project, "created_at": {"$gte": since}}
        group: Document = {
            "_id": {"day": day, "model": MODEL_KEY},
            "batches": {"$sum": 1},
            "completed": {"$sum": {"$ifNull": ["$request_counts.completed", 0]}},
            "failed": {"$sum": {"$ifNull": ["$request_counts.failed", 0]}},
            "input": {"$sum": {"$ifNull": ["$usage.input_tokens", 0]}},
            "cached": {"$sum": {"$ifNull": ["$usage.input_tokens_details.cached_tokens", 0]}},
            "output": {"$sum": {"$ifNull": ["$usage.output_tokens", 0]}},
            "total": {"$sum": {"$ifNull": ["$usage.total_tokens", 0]}},
        }
        rows = await self._by_model(match, group)
        return sorted(
            ({**r, "day": int(r["_id"]["day"]), "model": str(r["_id"]["model"])} for r in rows),
            key=lambda r: (-r["day"], r["model"]),
        )


MIXED = "(mixed)"
"""The model the views group mixed batches under (their usage per model: ``usage_by_model``)."""
MODEL_KEY = "<model>"


def _with_model(group: Document, model: Any) -> Document:
    """``group`` with ``MODEL_KEY`` in its ``_id`` replaced by ``model``'s expression."""
    key = group["_id"]
    if key == MODEL_KEY:
        return {**group, "_id": model}
    return {**group, "_id": {k: (model if v == MODEL_KEY else v) for k, v in key.items()}}
