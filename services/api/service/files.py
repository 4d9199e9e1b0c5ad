"""Files: bytes streamed to object storage, documents in MongoDB, scoped to a project."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import IO, TypeVar

from pydantic import BaseModel
from pydantic_core import to_json

from services.api.quotas.service import QuotaService
from shared import ids
from shared.documents import FileDocument
from shared.errors import InvalidRequest, NotFound, PayloadTooLarge, QuotaExceeded, echo
from shared.protocol.openai import Batch, FileObject, ListObject
from shared.released_files import purge_if_released
from shared.settings import ApiSettings
from shared.storage import ObjectStore, file_key
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore

PURPOSES = {"batch", "batch_output", "user_data", "fine-tune", "assistants", "vision", "evals"}
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 2_592_000


class FileService:
    def __init__(
        self,
        documents: FileStore,
        batches: BatchStore,
        store: ObjectStore,
        settings: ApiSettings,
        quotas: QuotaService | None = None,
    ) -> None:
        self.documents = documents
        self.batches = batches
        self.store = store
        self.settings = settings
        self.quotas = quotas  # None: no quotas

    async def upload(
        self,
        project: str,
        stream: IO[bytes],
        size: int | None,
        filename: str,
        purpose: str,
        expires_after_seconds: int | None = None,
    ) -> FileObject:
        self._check_upload(filename, purpose, size, expires_after_seconds)
        if self.quotas is not None:
            await self.quotas.check_upload(project, size or 0)
        now = int(time.time())
        file_id = ids.file_id()
        key = file_key(file_id)
        stored = await self.store.put_stream(key, stream, size if size is not None else -1)
        if self.quotas is not None and size is None:  # its size is known only now
            try:
                await self.quotas.check_upload(project, stored.size)
            except QuotaExceeded:
                await self.store.delete(key)
                raise
        public = FileObject(
            id=file_id,
            bytes=stored.size,
            checksum=stored.checksum,
            created_at=now,
            filename=filename,
            purpose=purpose,
            status="processed",
            expires_at=now + expires_after_seconds if expires_after_seconds else None,
        )
        await self.documents.insert(FileDocument.of(public, project, key))
        return public

    def _check_upload(self, filename: str, purpose: str, size: int | None, expires_after: int | None) -> None:
        if purpose not in PURPOSES:
            raise InvalidRequest(
                f"Invalid purpose {echo(purpose)}; expected one of {sorted(PURPOSES)}.",
                param="purpose",
                code="invalid_value",
            )
        if purpose == "batch" and not filename.endswith(".jsonl"):
            raise InvalidRequest(
                "A batch input file must be a .jsonl file.",
                param="file",
                code="invalid_file_format",
            )
        limit = upload_limit(self.settings, purpose)
        if size is not None and size > limit:
            raise PayloadTooLarge(f"The file is {size} bytes; the limit is {limit}.", param="file")
        if expires_after is not None and not MIN_EXPIRY_S <= expires_after <= MAX_EXPIRY_S:
            raise InvalidRequest(
                f"expires_after[seconds] must be between {MIN_EXPIRY_S} and {MAX_EXPIRY_S}.",
                param="expires_after[seconds]",
                code="invalid_value",
            )

    async def document(self, project: str, file_id: str) -> FileDocument:
        """The file's document, as its project sees it: deleted or expired files are not found."""
        doc = await self.documents.visible(project, file_id)
        if doc is None:
            raise NotFound.no_such("File", file_id, "file_id")
        return doc

    async def get(self, project: str, file_id: str) -> FileObject:
        return (await self.document(project, file_id)).public()

    async def list_page(
        self, project: str, purpose: str | None, limit: int, order: str, after: str | None
    ) -> ListObject:
        anchor = (await self.document(project, after)).sort_key if after else None
        docs = await self.documents.page(project, purpose, limit + 1, order == "desc", anchor)
        return page([d.public() for d in docs], limit, self.settings.max_list_bytes)

    async def delete(self, project: str, file_id: str) -> None:
        """Delete a file; one a running batch still reads is hidden now and its bytes kept.

        The kept bytes belong to the batch: the aggregator streams the input file again to name
        the lines of a cancelled or expired batch. They go when the last such batch ends
        (``shared/released_files.py``).
        """
        await self.document(project, file_id)  # 404 unless this project sees the file
        # Hidden first, then removed unless an unfinished batch reads it. Whichever comes last,
        # this or the end of that batch, removes it: the same check runs on both sides.
        await self.documents.hide(file_id)
        await purge_if_released(self.documents, self.batches, self.store, file_id)

    async def content(self, project: str, file_id: str) -> tuple[FileDocument, AsyncIterator[bytes]]:
        """The file's document (404 before any byte is sent) and its bytes."""
        doc = await self.document(project, file_id)
        return doc, self.store.iter_chunks(doc.object_key)


def upload_limit(settings: ApiSettings, purpose: str) -> int:
    """The largest file of a purpose, in bytes."""
    return settings.max_batch_input_bytes if purpose == "batch" else settings.max_file_bytes


def page(items: Sequence[FileObject | Batch], limit: int, max_bytes: int) -> ListObject:
    """A list object from up to ``limit + 1`` items (the extra one only says there is more),
    ending before the item that would take its items past ``max_bytes`` of JSON (the first is
    always in): a short page says ``has_more``, and ``after=<last_id>`` reads on from it."""
    data = within_budget(items[:limit], max_bytes)
    return ListObject(
        data=data,
        has_more=len(items) > len(data),
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


Item = TypeVar("Item", bound=BaseModel)


def within_budget(items: Sequence[Item], max_bytes: int) -> list[Item]:
    """The first of ``items`` whose JSON takes at most ``max_bytes`` in all; always the first one,
    whatever its size, so a page moves on."""
    kept: list[Item] = []
    used = 0
    for item in items:
        used += len(to_json(item)) + 1  # + the comma between items
        if kept and used > max_bytes:
            break
        kept.append(item)
    return kept
