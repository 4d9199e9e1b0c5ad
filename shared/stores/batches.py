"""The ``batches`` collection: every read and write of a batch document goes through here.

Status changes are named operations (start, fail, request_cancel, finalizing, finish) guarded by
the lifecycle: each is one conditional update on the statuses the move may start from
(:func:`shared.lifecycle.sources`), so a racing writer can never move a batch that already left
them, and each returns whether it moved the batch. A move to a terminal status calls the
store's ``on_end`` listener (the webhook event recorder, ``shared/webhooks.py``) right after it
succeeds, so every way a batch ends records its event in this one place.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pymongo import DESCENDING, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from shared import lifecycle
from shared.documents import PROGRESS_SAMPLES, BatchDocument
from shared.lifecycle import BatchStatus
from shared.protocol.openai import BatchError, BatchErrors
from shared.seen_lines import SeenLines

Document = dict[str, Any]
# (batch id, project, terminal status), awaited after a batch ended.
EndListener = Callable[[str, str, BatchStatus], Awaitable[None]]


# The batch document's fields the api's dispatcher reads (``DispatchView``).
DISPATCH_FIELDS = {
    "model": 1,
    "project": 1,
    "status": 1,
    "priority": 1,
    "prefix_order": 1,
    "expires_at": 1,
    "sort_key": 1,
    "input_file_id": 1,
    "defaults": 1,
    "request_counts.total": 1,
    "emitted": 1,
    "resumed": 1,
    "parts": 1,
    "emitted_parts": 1,
    "mixed_models": 1,
}


def dispatch_unit(batch_id: str, part: int | None) -> str:
    """What the dispatcher sends and positions as one: the batch, or one part of a mixed batch."""
    return batch_id if part is None else f"{batch_id}#{part}"


@dataclass(frozen=True)
class DispatchView:
    """What the api's dispatcher reads of a batch it may dispatch (``DISPATCH_FIELDS``)."""

    batch_id: str
    model: str | None
    project: str
    status: str
    priority: int
    prefix_order: bool  # sent in its dispatch order (services/api/service/dispatch_order.py)
    expires_at: float  # infinity when the batch has no deadline
    sort_key: int
    input_file_id: str
    defaults: Document
    total: int
    emitted: bool  # every line was sent
    resumed: bool  # run again after a broker loss: lines with a result (seen_lines) are not sent
    part: int | None = None  # a mixed batch's part (the lines of ``model``), or None: every line
    parts: int = 1  # how many parts the batch has

    @property
    def unit(self) -> str:
        return dispatch_unit(self.batch_id, self.part)

    @classmethod
    def of_document(cls, doc: Document) -> list[DispatchView]:
        """The batch's view, or one per part of a mixed batch (``shared/documents.py``)."""
        view = cls.from_document(doc)
        parts = doc.get("parts")
        if not doc.get("mixed_models") or not parts:
            if parts:  # one model: its base model's workers run it (an adapter's lines too)
                return [replace(view, model=parts[0].get("model") or view.model)]
            return [view]
        emitted, n = set(doc.get("emitted_parts") or ()), len(parts)
        return [
            replace(view, model=p.get("model"), total=int(p["lines"]), part=i, parts=n, emitted=i in emitted)
            for i, p in enumerate(parts)
        ]

    @classmethod
    def from_document(cls, doc: Document) -> DispatchView:
        expires_at = doc.get("expires_at")
        return cls(
            batch_id=str(doc["_id"]),
            model=doc.get("model"),
            project=str(doc.get("project") or "default"),
            status=str(doc["status"]),
            priority=int(doc.get("priority") or 0),
            prefix_order=bool(doc.get("prefix_order")),
            expires_at=float(expires_at) if expires_at is not None else float("inf"),
            sort_key=int(doc.get("sort_key") or 0),
            input_file_id=str(doc.get("input_file_id") or ""),
            defaults=dict(doc.get("defaults") or {}),
            total=int((doc.get("request_counts") or {}).get("total") or 0),
            emitted=bool(doc.get("emitted")),
            resumed=bool(doc.get("resumed")),
        )


@dataclass(frozen=True)
class LiveCounts:
    """A batch's counts so far, as the aggregator flushes them."""

    completed: int
    failed: int
    usage: Mapping[str, Any]
    seen_lines: bytes | None = None  # the seen-lines bitmap, for the api's dispatcher (lost lines)
    sample: bool = True  # also append these counts to the batch's progress history


@dataclass(frozen=True)
class BatchSummary:
    """The few fields the aggregator needs on its hot path (a projected read)."""

    batch_id: str
    status: str
    total: int
    project: str
    expires_at: int | None
    resumed: bool = False  # its counts restart from the stored ones (``BatchStore.resume``)

    @property
    def terminal(self) -> bool:
        return self.status in lifecycle.TERMINAL

    @property
    def settled(self) -> bool:
        """True when a cached copy can be trusted (total known, or the batch is over)."""
        return self.terminal or (self.status in lifecycle.RUNNING and self.total > 0)


@dataclass(frozen=True)
class EnqueuedBatch:
    """What the api's quotas read of an unfinished batch (services/api/quotas)."""

    batch_id: str
    total: int
    done: int  # lines with a result (completed + failed)
    enqueued: Mapping[str, Mapping[str, int]]  # model -> {lines, tokens}, set at validation
    enqueued_at: int  # nanoseconds, when it was set


def _sample(now: float, counts: LiveCounts) -> Document:
    """A ``$push`` of one progress sample, keeping the newest ``PROGRESS_SAMPLES``."""
    return {"$each": [[now, counts.completed, counts.failed]], "$slice": -PROGRESS_SAMPLES}


def _now() -> int:
    return int(time.time())


class BatchStore:
    def __init__(self, collection: AsyncCollection[Document], on_end: EndListener | None = None) -> None:
        self._batches = collection
        self._on_end = on_end

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

    async def summary(self, batch_id: str) -> BatchSummary | None:
        projection = {"status": 1, "request_counts.total": 1, "project": 1, "expires_at": 1, "resumed": 1}
        doc = await self._batches.find_one({"_id": batch_id}, projection)
        if doc is None:
            return None
        return BatchSummary(
            batch_id=str(doc["_id"]),
            status=str(doc.get("status", "")),
            total=int((doc.get("request_counts") or {}).get("total") or 0),
            project=str(doc.get("project") or "default"),
            expires_at=doc.get("expires_at"),
            resumed=bool(doc.get("resumed")),
        )

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

    async def overdue(self, now: float, cancel_timeout_s: float, limit: int) -> list[str]:
        """Ids of batches that must end now although lines may lack results (expiry sweep).

        The filter form of ``services/aggregator/closing.close_reason``, plus batches left
        ``finalizing`` for ``cancel_timeout_s`` (the finalize ends them ``completed``).
        """
        query = {
            "$or": [
                {"status": {"$in": sorted(lifecycle.EXPIRABLE)}, "expires_at": {"$lte": now}},
                {"status": "cancelling", "cancelling_at": {"$lte": now - cancel_timeout_s}},
                # The api's dispatcher saw every line it sent come back: no need to wait.
                {"status": "cancelling", "dispatch_settled": True},
                # A finalize that has not ended as long after it began lost its finalizer (an
                # aggregator whose state was reset): the batch's results are all in its chunks.
                {"status": "finalizing", "finalizing_at": {"$lte": now - cancel_timeout_s}},
            ]
        }
        cursor = self._batches.find(query, {"_id": 1}).limit(limit)
        return [str(doc["_id"]) async for doc in cursor]

    async def resumed_ids(self) -> list[str]:
        """Batches running again after a broker loss (``resume``): the aggregator's sweep checks
        those it has no state for, which may be complete already."""
        query = {"status": "in_progress", "resumed": True}
        return [str(d["_id"]) async for d in self._batches.find(query, {"_id": 1})]

    async def in_progress_ids(self) -> list[str]:
        return [str(d["_id"]) async for d in self._batches.find({"status": "in_progress"}, {"_id": 1})]

    # ---------------------------------------------------------------- transitions

    async def _move(self, batch_id: str, target: BatchStatus, fields: Document | None = None) -> bool:
        update = {"status": target, f"{target}_at": _now(), **(fields or {})}
        guard = {"_id": batch_id, "status": {"$in": sorted(lifecycle.sources(target))}}
        if self._on_end is None or target not in lifecycle.TERMINAL:
            result = await self._batches.update_one(guard, {"$set": update})
            return result.modified_count > 0
        # ``end_recorded`` is False from the move until the listener has run, in the same update
        # as the move: a process killed in between leaves a mark ``unrecorded_ends`` finds.
        update["end_recorded"] = False
        before = await self._batches.find_one_and_update(guard, {"$set": update}, projection={"project": 1})
        if before is None:
            return False
        await self._on_end(batch_id, str(before.get("project") or "default"), target)
        await self._batches.update_one({"_id": batch_id}, {"$set": {"end_recorded": True}})
        return True

    async def announce_end(self, batch: BatchDocument) -> None:
        """Call the end listener again for a batch found terminal (a finalize repeated after a
        crash between the move and the listener, or ``unrecorded_ends``; the recorder stores an
        event once)."""
        if self._on_end is not None and batch.status in lifecycle.TERMINAL:
            await self._on_end(batch.id, batch.project, batch.status)
            await self._batches.update_one({"_id": batch.id}, {"$set": {"end_recorded": True}})

    async def unrecorded_ends(self, ended_before: float, limit: int) -> list[BatchDocument]:
        """Batches that ended before ``ended_before`` whose end listener never ran (the process
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
    ) -> bool:
        """validating -> in_progress, with the model, the number of request lines, whether a
        dispatch order was made (``services/api/service/dispatch_order.py``), the lines' parts by base
        model and the lines and estimated tokens per model the quotas count (``enqueued``,
        ``shared/documents.py``)."""
        fields: Document = {
            "model": model,
            "request_counts.total": total,
            "prefix_order": prefix_order,
            "parts": parts,
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
        return await self._move(batch_id, status, fields)

    # ---------------------------------------------------------------- other writes

    async def mark_emitted(self, batch_id: str, part: int | None = None, parts: int = 1) -> None:
        """The dispatcher has published every line of the batch (of one of its ``parts``)."""
        if part is None:
            await self._batches.update_one({"_id": batch_id}, {"$set": {"emitted": True}})
            return
        await self._batches.update_one({"_id": batch_id}, {"$addToSet": {"emitted_parts": part}})
        every = {"_id": batch_id, f"emitted_parts.{parts - 1}": {"$exists": True}}
        await self._batches.update_one(every, {"$set": {"emitted": True}})

    async def mark_dispatchable(self, batch_id: str) -> None:
        """Validated: the api's dispatcher may stream its lines (services/api/dispatch)."""
        await self._batches.update_one({"_id": batch_id}, {"$set": {"dispatchable": True}})

    async def settle_dispatch(self, batch_id: str, part: int | None = None, parts: int = 1) -> None:
        """A cancelling batch whose every dispatched line came back (of each of its ``parts``):
        the aggregator may end it."""
        if part is not None:
            await self._batches.update_one({"_id": batch_id}, {"$addToSet": {"settled_parts": part}})
        every: Document = {"_id": batch_id, "status": "cancelling"}
        if part is not None:
            every[f"settled_parts.{parts - 1}"] = {"$exists": True}
        await self._batches.update_one(every, {"$set": {"dispatch_settled": True}})

    async def dispatch_queue(self) -> list[DispatchView]:
        """What the api's dispatcher reads of every validated batch still running or cancelling."""
        query = {"dispatchable": True, "status": {"$in": sorted(lifecycle.DISPATCHING)}}
        found = self._batches.find(query, DISPATCH_FIELDS)
        return [view async for doc in found for view in DispatchView.of_document(doc)]

    async def seen_lines(self, batch_ids: Iterable[str]) -> dict[str, SeenLines]:
        """The aggregator's seen-lines bitmaps of these batches, as last flushed."""
        found = self._batches.find({"_id": {"$in": list(batch_ids)}}, {"seen_lines": 1})
        return {str(d["_id"]): SeenLines.from_compressed(d.get("seen_lines")) async for d in found}

    async def count_attempt(self, batch_id: str) -> int:
        """Count one more processing attempt; returns the attempts so far, this one included."""
        doc = await self._batches.find_one_and_update(
            {"_id": batch_id}, {"$inc": {"attempts": 1}}, projection={"attempts": 1}, return_document=True
        )
        return int((doc or {}).get("attempts") or 0)

    async def live_counts(self, counts: Mapping[str, LiveCounts]) -> int:
        """Write the counts so far of many batches in one bulk request; returns the batches sent.

        Absolute values (``$set``), so a flush repeated after a crash is harmless (it may add one
        more progress sample); only batches still counting are written (a finished batch keeps its
        final counts).
        """
        if not counts:
            return 0
        guard = sorted(lifecycle.COUNTING)
        now = round(time.time(), 3)
        updates = [
            UpdateOne(
                {"_id": batch_id, "status": {"$in": guard}},
                {
                    "$set": {
                        "request_counts.completed": c.completed,
                        "request_counts.failed": c.failed,
                        "usage": dict(c.usage),
                        **({"seen_lines": c.seen_lines} if c.seen_lines is not None else {}),
                    },
                    # A bounded history for the progress plot, on the same write.
                    **(
                        {
                            "$push": {
                                "progress": {
                                    "$each": [[now, c.completed, c.failed]],
                                    "$slice": -PROGRESS_SAMPLES,
                                }
                            }
                        }
                        if c.sample
                        else {}
                    ),
                },
            )
            for batch_id, c in counts.items()
        ]
        await self._batches.bulk_write(updates, ordered=False)
        return len(updates)

    async def resume(self, batch_id: str, counts: LiveCounts) -> list[str]:
        """Run an in_progress batch again after the broker lost its messages, from what its stored
        results say (``counts``, tallied from its result chunks): the dispatcher sends only the
        lines without a result, the aggregator counts on from these counts (``resumed``). Returns
        the batch's dispatch units (``dispatch_unit``), whose positions must go."""
        doc = await self._batches.find_one_and_update(
            {"_id": batch_id, "status": "in_progress"},
            {
                "$set": {
                    "emitted": False,
                    "emitted_parts": [],
                    "resumed": True,
                    "request_counts.completed": counts.completed,
                    "request_counts.failed": counts.failed,
                    "usage": dict(counts.usage),
                    "seen_lines": counts.seen_lines or b"",
                },
            },
            projection={"parts": 1, "mixed_models": 1},
        )
        parts = (doc or {}).get("parts") or ()
        if not (doc or {}).get("mixed_models"):
            return [batch_id]
        return [dispatch_unit(batch_id, i) for i in range(len(parts))]

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
