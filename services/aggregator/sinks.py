"""Object-storage sinks: the chunk writer (hot path) and the finalizer (once per batch).

Finalize is idempotent and crash-safe: file ids derive from the batch id, file documents are
upserted, and the batch moves to its terminal status only after both files are stored, so a
re-run after a crash anywhere produces the same result. Chunks are deleted last.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from services.aggregator import metrics
from services.aggregator.batches import BatchDirectory
from services.aggregator.chunks import encode_chunk, merge_and_split
from services.aggregator.state import BatchState
from shared.documents import file_document
from shared.protocol.messages import ResultMessage
from shared.protocol.openai import TERMINAL_STATUSES, FileObject
from shared.storage import ObjectStore, file_key, result_chunk_prefix

log = logging.getLogger(__name__)

Document = dict[str, Any]


def output_file_id(batch_id: str, kind: str) -> str:
    """The deterministic id of a batch's ``output`` or ``error`` file."""
    digest = hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()
    return f"file-{digest[:24]}"


def _make_work_dir(parent: str, batch_id: str) -> str:
    Path(parent).mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(dir=parent, prefix=f"{batch_id}-")


class ChunkWriter:
    """Writes one chunk object per batch per processed chunk of results."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    async def write(self, batch_id: str, results: list[ResultMessage]) -> str:
        """Store ``results`` (sorted by line) as one object; the name sorts by write time."""
        key = f"{result_chunk_prefix(batch_id)}{time.time_ns():020d}-{secrets.token_hex(4)}.chunk"
        await self._store.put_bytes(key, encode_chunk(results))
        metrics.CHUNKS_WRITTEN.inc()
        return key


class Finalizer:
    """Merges a complete batch's chunks into its output and error files and ends the batch."""

    def __init__(
        self,
        *,
        batches: AsyncCollection[Document],
        files: AsyncCollection[Document],
        store: ObjectStore,
        states: MutableMapping[str, Any],
        directory: BatchDirectory,
        work_dir: str,
        download_concurrency: int = 16,
    ) -> None:
        self._batches = batches
        self._files = files
        self._store = store
        self._states = states
        self._directory = directory
        self._work_dir = work_dir
        self._download_slots = asyncio.Semaphore(download_concurrency)

    async def finalize(self, batch_id: str) -> str | None:
        """Finalize the batch if every line is accounted for; returns the status it ended in."""
        doc = await self._batches.find_one({"_id": batch_id})
        if doc is None:
            log.warning("finalize: no batch document", extra={"batch_id": batch_id})
            return None
        status = str(doc.get("status"))
        if status in TERMINAL_STATUSES:
            await self.cleanup(batch_id, status)
            return status
        total = int((doc.get("request_counts") or {}).get("total") or 0)
        state = BatchState.from_dict(self._states.get(batch_id))
        if status not in {"in_progress", "finalizing", "cancelling"} or not 0 < total <= state.done:
            return None
        started = time.monotonic()
        final = "cancelled" if status == "cancelling" else "completed"
        if status == "in_progress":
            await self._batches.update_one(
                {"_id": batch_id, "status": "in_progress"},
                {"$set": {"status": "finalizing", "finalizing_at": int(time.time())}},
            )
        update = await self._write_files(batch_id, str(doc.get("project") or "default"))
        update["request_counts"]["total"] = total
        update.update(status=final, usage=state.usage_document(), **{f"{final}_at": int(time.time())})
        await self._batches.update_one(
            {"_id": batch_id, "status": {"$in": ["in_progress", "finalizing", "cancelling"]}},
            {"$set": update},
        )
        if state.completed != update["request_counts"]["completed"]:
            log.warning(
                "finalize: file counts differ from live counts",
                extra={"batch_id": batch_id, "live": state.done, "files": update["request_counts"]},
            )
        metrics.BATCHES_FINALIZED.labels(final).inc()
        metrics.FINALIZE_SECONDS.observe(time.monotonic() - started)
        log.info("batch finalized", extra={"batch_id": batch_id, "status": final, **update})
        await self.cleanup(batch_id, final)
        return final

    async def cleanup(self, batch_id: str, status: str) -> None:
        """Forget a terminal batch: its chunk objects and its table entry."""
        self._directory.mark(batch_id, status)
        await self._store.delete_prefix(result_chunk_prefix(batch_id))
        if batch_id in self._states:
            del self._states[batch_id]

    async def _write_files(self, batch_id: str, project: str) -> dict[str, Any]:
        work = Path(await asyncio.to_thread(_make_work_dir, self._work_dir, batch_id))
        try:
            chunks = await self._download_chunks(batch_id, work)
            output, errors = work / "output.jsonl", work / "error.jsonl"
            split = await asyncio.to_thread(merge_and_split, chunks, work, output, errors)
            output_id = error_id = None
            if split.completed:
                output_id = await self._register(batch_id, "output", output, project)
            if split.failed:
                error_id = await self._register(batch_id, "error", errors, project)
        finally:
            await asyncio.to_thread(shutil.rmtree, work, True)
        return {
            "output_file_id": output_id,
            "error_file_id": error_id,
            "request_counts": {"completed": split.completed, "failed": split.failed},
        }

    async def _download_chunks(self, batch_id: str, work: Path) -> list[Path]:
        keys = sorted(await self._store.list_keys(result_chunk_prefix(batch_id)))
        paths = [work / f"chunk-{i:08d}" for i in range(len(keys))]

        async def fetch(key: str, path: Path) -> None:
            async with self._download_slots:
                await self._store.get_file(key, str(path))

        await asyncio.gather(*(fetch(k, p) for k, p in zip(keys, paths, strict=True)))
        return paths

    async def _register(self, batch_id: str, kind: str, path: Path, project: str) -> str:
        """Upload one file and upsert its document; the same id and key on every re-run."""
        file_id = output_file_id(batch_id, kind)
        key = file_key(file_id)
        size = await self._store.put_file(key, str(path))
        public = FileObject(
            id=file_id,
            bytes=size,
            created_at=int(time.time()),
            filename=f"{batch_id}_{kind}.jsonl",
            purpose="batch_output",
            status="processed",
        )
        doc = file_document(public, project, key)
        doc.pop("_id")
        created_at = doc.pop("created_at")
        await self._files.update_one(
            {"_id": file_id},
            {"$set": doc, "$setOnInsert": {"created_at": created_at}},
            upsert=True,
        )
        return file_id
