"""Finalize: a batch's chunks merged into its output and error files, and the batch ended.

``FinalizeScheduler`` runs at most ``finalize_concurrency`` finalizations at once, one per batch,
in the background of the hot path (counting schedules a batch once every line is counted; the
sweep, one that is due). ``Finalizer`` merges the chunks (``chunks.py``), fills the lines of a
batch ended early (``overdue.py``), registers the files and ends the batch.

Finalize is idempotent and crash-safe: file ids derive from the batch id, file documents are
upserted, and the batch moves to its terminal status only after both files are stored, so a
re-run after a crash anywhere produces the same result. Chunks are deleted last.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import tempfile
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.aggregator import metrics
from services.aggregator.chunks import merge_and_split
from services.aggregator.overdue import close_reason, write_fill
from services.aggregator.settings import AggregatorConfig
from services.aggregator.state import BatchState, SeenLines
from shared import lifecycle
from shared.documents import FileDocument
from shared.input_lines import request_lines
from shared.protocol.messages import NotRunCode
from shared.protocol.openai import FileObject
from shared.released_files import purge_if_released
from shared.result_chunks import UsageByModel
from shared.storage import ObjectNotFound, ObjectStore, batch_prefix, file_key, result_chunk_prefix
from shared.stores.batch_progress import BatchDirectory
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fill:
    """What the error lines of a batch ended early are made from."""

    code: NotRunCode
    input_file_id: str
    seen: SeenLines


def output_file_id(batch_id: str, kind: str) -> str:
    """The deterministic id of a batch's ``output`` or ``error`` file."""
    digest = hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()
    return f"file-{digest[:24]}"


def _usage_by_model(output: Path) -> dict[str, Any]:
    tally = UsageByModel()
    with output.open("rb") as lines:
        for line in lines:
            tally.add(line)
    return tally.documents()


def _make_work_dir(parent: str, batch_id: str) -> str:
    Path(parent).mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(dir=parent, prefix=f"{batch_id}-")


class FinalizeScheduler:
    """Runs at most one finalize per batch at a time, in the background of the hot path."""

    def __init__(self, finalizer: Finalizer, concurrency: int) -> None:
        self._finalizer = finalizer
        self._slots = asyncio.Semaphore(concurrency)
        self._running: dict[str, asyncio.Task[None]] = {}

    def schedule(self, batch_id: str) -> None:
        if batch_id not in self._running:
            self._running[batch_id] = asyncio.create_task(self._run(batch_id))

    async def _run(self, batch_id: str) -> None:
        try:
            async with self._slots:
                await self._finalizer.finalize(batch_id)
        except Exception:
            # The sweep tries again; nothing is lost while the document is not terminal.
            log.exception("finalize failed", extra={"batch_id": batch_id})
        finally:
            self._running.pop(batch_id, None)

    async def drain(self, timeout_s: float) -> None:
        """Let running finalizations finish (on shutdown); cancel what remains after timeout."""
        tasks = list(self._running.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()


class Finalizer:
    """Merges a complete batch's chunks into its output and error files and ends the batch."""

    def __init__(
        self,
        config: AggregatorConfig,
        *,
        batches: BatchStore,
        files: FileStore,
        store: ObjectStore,
        states: MutableMapping[str, Any],
        directory: BatchDirectory,
    ) -> None:
        """``config``: the scratch directory (``data_dir``), ``download_concurrency`` and
        ``cancel_timeout_s``; ``batches`` calls its end listener when a batch ends."""
        self._batches = batches
        self._files = files
        self._store = store
        self._states = states
        self._directory = directory
        self._work_dir = config.data_dir
        self._download_slots = asyncio.Semaphore(config.download_concurrency)
        self._cancel_timeout_s = config.cancel_timeout_s

    async def finalize(self, batch_id: str) -> str | None:
        """End the batch if it is due; returns the status it ended in (None: not due yet).

        Due when every line is accounted for (``completed``, or ``cancelled`` when cancelling),
        or when it must end early (:func:`close_reason`: expired, or the cancel timeout ran
        out); lines still without a result then get a ``batch_expired``/``batch_cancelled``
        error line.
        """
        batch = await self._batches.get(batch_id)
        if batch is None:
            log.warning("finalize: no batch document", extra={"batch_id": batch_id})
            return None
        status = batch.status
        input_file_id = batch.input_file_id
        if status in lifecycle.TERMINAL:
            await self._batches.announce_end(batch)  # recorded once, even if recorded before
            await self.cleanup(batch_id, status, input_file_id)
            return status
        total = batch.request_counts.total
        raw = self._states.get(batch_id)
        state = BatchState.resumed(batch) if raw is None and batch.resumed else BatchState.from_dict(raw)
        # ``finalizing`` is only ever set once every line's result is in the chunks: a batch left
        # there by a finalizer that died is complete even when this worker has no state for it
        # (the local stack empties the table when its memory-only broker lost the changelog).
        complete = status == "finalizing" or (status in lifecycle.RUNNING and 0 < total <= state.done)
        reason = None if complete else close_reason(batch, time.time(), self._cancel_timeout_s)
        if not complete and reason is None:
            return None
        started = time.monotonic()
        final: lifecycle.BatchStatus
        if reason is not None:
            final = reason.status
        else:
            final = "cancelled" if status == "cancelling" else "completed"
        if complete and status == "in_progress":
            await self._batches.finalizing(batch_id)
        fill = None
        if reason is not None and total > 0:
            fill = Fill(reason.code, input_file_id, state.seen)
        update = await self._write_files(
            batch_id, batch.project, fill, batch.output_files_expire_at(), by_model=batch.mixed_models
        )
        counts = update["request_counts"]
        counts["total"] = total
        if fill is not None and counts["completed"] + counts["failed"] != total:
            log.warning(
                "finalize: lines in the files differ from the total",
                extra={"batch_id": batch_id, "total": total, "files": dict(counts)},
            )
            counts["failed"] = max(total - counts["completed"], 0)  # keep the counts whole
        # Without a state (see above) the last usage flushed with the live counts is what is known.
        update["usage"] = state.usage_document() if state.done else batch.usage.model_dump()
        await self._batches.finish(batch_id, final, **update)
        if state.completed != counts["completed"]:
            log.warning(
                "finalize: file counts differ from live counts",
                extra={"batch_id": batch_id, "live": state.done, "files": counts},
            )
        metrics.BATCHES_FINALIZED.labels(final).inc()
        metrics.FINALIZE_SECONDS.observe(time.monotonic() - started)
        log.info("batch finalized", extra={"batch_id": batch_id, "status": final, **update})
        await self.cleanup(batch_id, final, input_file_id)
        return final

    async def cleanup(self, batch_id: str, status: str, input_file_id: str = "") -> None:
        """Forget a terminal batch: its chunk objects, its table entry, an input file deleted
        while it ran (``shared/released_files.py``)."""
        self._directory.mark(batch_id, status)
        # The result chunks and the dispatch order: nothing reads them once the files exist.
        await self._store.delete_prefix(batch_prefix(batch_id))
        if batch_id in self._states:
            del self._states[batch_id]
        await purge_if_released(self._files, self._batches, self._store, input_file_id)

    async def _write_files(
        self, batch_id: str, project: str, fill: Fill | None, expires_at: int | None, by_model: bool = False
    ) -> dict[str, Any]:
        """Write and register the files; with ``by_model``, also the usage per model (read back
        from the output file: a mixed batch's only)."""
        usage_by_model = None
        work = Path(await asyncio.to_thread(_make_work_dir, self._work_dir, batch_id))
        try:
            chunks = await self._download_chunks(batch_id, work)
            if fill is not None and (path := await self._write_fill(batch_id, fill, work)):
                chunks.append(path)  # last: a real result for the same line wins
            output, errors = work / "output.jsonl", work / "error.jsonl"
            split = await asyncio.to_thread(merge_and_split, chunks, work, output, errors)
            output_id = error_id = None
            if by_model:
                usage_by_model = await asyncio.to_thread(_usage_by_model, output)
            if split.completed:
                output_id = await self._register(batch_id, "output", output, project, expires_at)
            if split.failed:
                error_id = await self._register(batch_id, "error", errors, project, expires_at)
        finally:
            await asyncio.to_thread(shutil.rmtree, work, True)
        return {
            "output_file_id": output_id,
            "error_file_id": error_id,
            "request_counts": {"completed": split.completed, "failed": split.failed},
            "usage_by_model": usage_by_model,
            "not_run_counts": split.not_run,
        }

    async def _write_fill(self, batch_id: str, fill: Fill, work: Path) -> Path | None:
        """Error lines for the lines without a result, streamed from the input file."""
        file_doc = await self._files.get(fill.input_file_id)
        if file_doc is None or not file_doc.object_key:
            log.warning("finalize: input file gone", extra={"batch_id": batch_id})
            return None
        path = work / "fill.chunk"
        try:
            lines = request_lines(self._store.iter_chunks(file_doc.object_key))
            written = await write_fill(batch_id, lines, fill.seen, fill.code, path)
        except ObjectNotFound:
            log.warning("finalize: input object gone", extra={"batch_id": batch_id})
            return None
        log.info(
            "finalize: lines never run", extra={"batch_id": batch_id, "lines": written, "code": fill.code}
        )
        return path

    async def _download_chunks(self, batch_id: str, work: Path) -> list[Path]:
        keys = sorted(await self._store.list_keys(result_chunk_prefix(batch_id)))
        paths = [work / f"chunk-{i:08d}" for i in range(len(keys))]

        async def fetch(key: str, path: Path) -> None:
            async with self._download_slots:
                await self._store.get_file(key, str(path))

        await asyncio.gather(*(fetch(k, p) for k, p in zip(keys, paths, strict=True)))
        return paths

    async def _register(
        self, batch_id: str, kind: str, path: Path, project: str, expires_at: int | None
    ) -> str:
        """Upload one file and upsert its document; the same id and key on every re-run.
        ``expires_at`` comes from the batch's ``output_expires_after`` (None: never)."""
        file_id = output_file_id(batch_id, kind)
        key = file_key(file_id)
        stored = await self._store.put_file(key, str(path))
        public = FileObject(
            id=file_id,
            bytes=stored.size,
            checksum=stored.checksum,
            created_at=int(time.time()),
            filename=f"{batch_id}_{kind}.jsonl",
            purpose="batch_output",
            status="processed",
            expires_at=expires_at,
        )
        await self._files.upsert(FileDocument.of(public, project, key))
        return file_id
