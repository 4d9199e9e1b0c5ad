"""Results so far of a running batch, streamed from the aggregator's result chunks.

While a batch runs, the aggregator stores each processed group of results as one chunk object
(``batches/<id>/results/``, format in ``shared/result_chunks.py``). This reads those chunks
in write order and streams the output lines (status 200) or the error lines, each line once.
Lines come in arrival order (sorted by line within a chunk), not input order; a chunk that
finalize deletes while it is read is skipped. Memory: one chunk line and a bitmap of the lines
sent (6 KB for 50,000 lines). Once the batch is terminal, the final output or error file is
streamed instead, so the call works the same before and after the end.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Literal

from shared.documents import BatchDocument
from shared.errors import NotFound
from shared.lifecycle import TERMINAL
from shared.result_chunks import parse_record
from shared.seen_lines import SeenLines
from shared.storage import ObjectNotFound, ObjectStore, result_chunk_prefix
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore

log = logging.getLogger(__name__)

Kind = Literal["output", "error"]


class PartialOutputService:
    def __init__(self, batches: BatchStore, files: FileStore, store: ObjectStore) -> None:
        self.batches = batches
        self.files = files
        self.store = store

    async def open(self, project: str, batch_id: str, kind: Kind) -> AsyncGenerator[bytes]:
        """Look the batch up (404 before any byte is sent), then return the byte stream."""
        batch = await self.batches.get(batch_id, project)
        if batch is None:
            raise NotFound.no_such("Batch", batch_id, "batch_id")
        if batch.status in TERMINAL:
            return self._final_file(batch, kind)
        return self._chunks(batch_id, kind)

    async def _final_file(self, batch: BatchDocument, kind: Kind) -> AsyncGenerator[bytes]:
        file_id = batch.output_file_id if kind == "output" else batch.error_file_id
        file_doc = await self.files.get(file_id) if file_id else None
        if file_doc is None:
            return
        async for chunk in self.store.iter_chunks(file_doc.object_key):
            yield chunk

    async def _chunks(self, batch_id: str, kind: Kind) -> AsyncGenerator[bytes]:
        wanted = kind == "output"
        sent = SeenLines()
        for key in sorted(await self.store.list_keys(result_chunk_prefix(batch_id))):
            try:
                async for raw in self.store.iter_lines(key):
                    if not raw.strip():
                        continue
                    record = parse_record(raw)
                    if record.succeeded != wanted or record.line < 1:
                        continue
                    if record.line in sent:
                        continue  # a line written twice (a redelivery after a crash)
                    sent.add(record.line)
                    yield record.payload + b"\n"
            except ObjectNotFound:
                log.info("partial output: a chunk was finalized meanwhile", extra={"key": key})
