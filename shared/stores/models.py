"""The ``models`` collection: inference workers upsert it as a heartbeat (:meth:`ModelStore.beat`,
called by ``services/inference/heartbeat.py``), the api reads it (document shape in
``shared/documents.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from shared.protocol.extensions import WorkerStatus
from shared.protocol.openai import ModelCard

Document = dict[str, Any]

MODEL_NOT_FOUND = "model_not_found"
"""The error code of a model (or adapter) no worker serves: the API's 404, a validation error, a
mixed batch's line."""

HEARTBEAT_INTERVAL_S = 10.0
"""How often each inference worker refreshes its model's document."""
WORKER_ALIVE_S = 3 * HEARTBEAT_INTERVAL_S
"""A worker whose last heartbeat is older than this is shown as not alive."""
WORKER_FORGOTTEN_S = 600.0
"""A worker silent for this long is dropped from its model's document at the next heartbeat."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What validation needs of a model a line may name: the base model whose workers run it
    (itself, or an adapter's parent: its lines go to that model's requests topic) and its
    context length (None when unknown)."""

    base: str
    max_context_length: int | None


def card_of(doc: Document) -> ModelCard:
    """A model document's card (the fields ``/v1/models`` lists)."""
    return ModelCard(
        id=doc["_id"],
        created=int(doc.get("created", 0)),
        max_context_length=doc.get("max_context_length"),
        parent=doc.get("parent"),
    )


def current(docs: list[Document]) -> list[Document]:
    """``docs`` less the adapters that their model's workers no longer announce: an adapter's
    document is refreshed with its model's by every heartbeat, so one left ``WORKER_ALIVE_S``
    behind its model's was dropped from the workers' settings. Base models stay (their lines
    wait on Kafka while no worker runs)."""
    beats = {d["_id"]: float(d.get("last_seen") or 0) for d in docs if not d.get("parent")}
    return [
        d
        for d in docs
        if not d.get("parent") or beats.get(d["parent"], 0) - float(d.get("last_seen") or 0) <= WORKER_ALIVE_S
    ]


def worker_statuses(doc: Document, now: float) -> list[WorkerStatus]:
    """The workers a model document lists, most recently seen first."""
    workers = sorted(doc.get("workers") or [], key=lambda w: -float(w.get("last_seen", 0)))
    return [
        WorkerStatus(
            id=str(w.get("id", "")),
            last_seen=float(w.get("last_seen", 0)),
            alive=now - float(w.get("last_seen", 0)) <= WORKER_ALIVE_S,
        )
        for w in workers
    ]


class ModelStore:
    def __init__(self, collection: AsyncCollection[Document]) -> None:
        self._models = collection

    async def cards(self) -> list[ModelCard]:
        return [card_of(d) for d in await self.documents()]

    async def card(self, model_id: str) -> ModelCard | None:
        return next((card_of(d) for d in await self.documents() if d["_id"] == model_id), None)

    async def documents(self) -> list[Document]:
        """Every model document, by id (for status views: cards plus their workers), less the
        adapters their model's workers no longer serve (``current``)."""
        return current(await self._models.find({}).sort("_id").to_list())

    async def served(self) -> dict[str, ServedModel]:
        """Every model and adapter a worker has announced, by the id a line names."""
        found = self._models.find({}, {"_id": 1, "max_context_length": 1, "parent": 1, "last_seen": 1})
        return {
            str(m["_id"]): ServedModel(str(m.get("parent") or m["_id"]), m.get("max_context_length"))
            for m in current(await found.to_list())
        }

    async def beat(
        self,
        model_id: str,
        worker: str,
        max_context_length: int | None,
        endpoints: list[str],
        adapters: list[str] | tuple[str, ...] = (),
    ) -> None:
        """One worker's heartbeat: the model's facts (and each of its LoRA adapters', with the
        model as ``parent``), the worker's ``last_seen``, and workers silent for
        ``WORKER_FORGOTTEN_S`` dropped (one bulk write, never per request line)."""
        now = time.time()
        facts = {"max_context_length": max_context_length, "endpoints": {"$literal": endpoints}}
        updates = [
            UpdateOne({"_id": name}, self._beat(worker, now, {**facts, "parent": parent}), upsert=True)
            for name, parent in [(model_id, None), *((a, model_id) for a in adapters)]
        ]
        await self._models.bulk_write(updates, ordered=False)

    @staticmethod
    def _beat(worker: str, now: float, facts: Document) -> list[Document]:
        """The update of one model document: ``facts``, ``last_seen``, the worker's entry."""
        others = {
            "$filter": {
                "input": {"$ifNull": ["$workers", []]},
                "cond": {
                    "$and": [
                        {"$ne": ["$$this.id", {"$literal": worker}]},
                        {"$gt": ["$$this.last_seen", now - WORKER_FORGOTTEN_S]},
                    ]
                },
            }
        }
        return [
            {
                "$set": {
                    **facts,
                    "last_seen": now,
                    "created": {"$ifNull": ["$created", int(now)]},
                    "workers": {"$concatArrays": [others, [{"id": {"$literal": worker}, "last_seen": now}]]},
                }
            }
        ]
