"""Retry what failed: a new batch from a finished batch's error lines (``POST
/v1/batches/{id}/retry``, ``batchstream retry``).

The error file names each failed line by ``custom_id`` (unique within a batch: validation refuses
a repeat), so the new input file is the parent's input lines whose ``custom_id`` failed, optionally
only those with some error codes (matched as the error-lines view matches them), in the parent's
order and byte for byte. The new batch takes the parent's endpoint, window, priority and
batch-level defaults; its metadata is the parent's with ``retry_of`` set to the parent's id.

Memory does not grow with the batch: finalize writes the error file in input order, so one walk
reads the error lines and the input side by side, the next failed ``custom_id`` against each input
line. The selected lines go to a spooled copy, which goes to disk past a few megabytes.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import orjson

from services.api.schemas import BatchCreateParams
from services.api.service.batches import MAX_METADATA_PAIRS, BatchService
from services.api.service.error_lines import error_lines, matches
from services.api.service.files import FileService
from services.api.service.partial import PartialOutputService
from shared.errors import Conflict, InvalidRequest, echo
from shared.input_lines import is_request, split_lines
from shared.lifecycle import TERMINAL
from shared.protocol.batch_input import UTF8_BOM
from shared.protocol.openai import Batch

log = logging.getLogger(__name__)

RETRY_OF = "retry_of"
"""The metadata key that links a retry batch to the batch it retries."""
SPOOL_BYTES = 8 * 1024 * 1024


class RetryService:
    def __init__(self, batches: BatchService, files: FileService, partial: PartialOutputService) -> None:
        self.batches = batches
        self.files = files
        self.partial = partial

    async def retry(self, project: str, batch_id: str, codes: Sequence[str] | None) -> Batch:
        parent = await self.batches.document(project, batch_id)  # 404 for another project's
        if parent.status not in TERMINAL:
            raise Conflict(
                f"Batch {batch_id} is {parent.status}; retry it once it has ended.",
                param="batch_id",
                code="batch_not_finished",
            )
        source = await self.files.document(project, parent.input_file_id)  # 404 once deleted
        if parent.error_file_id:  # 404 once deleted or expired, not "no error lines"
            await self.files.document(project, parent.error_file_id)
        which = f" with code {echo(', '.join(codes), quote=False)}" if codes else ""
        nothing = InvalidRequest(
            f"Batch {batch_id} has no error lines{which} to retry.", param="codes", code="no_error_lines"
        )
        async with contextlib.AsyncExitStack() as streams:
            errors = await self.partial.open(project, batch_id, "error")
            streams.push_async_callback(errors.aclose)
            failed = _failed_custom_ids(errors, codes)
            streams.push_async_callback(failed.aclose)
            wanted = await anext(failed, None)
            if wanted is None:
                raise nothing
            chunks = self.files.store.iter_chunks(source.object_key)
            streams.push_async_callback(chunks.aclose)
            with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as selected:
                async for raw in split_lines(chunks):
                    raw = raw.removeprefix(UTF8_BOM)  # a file's BOM is not part of its first line
                    if is_request(raw) and _custom_id(raw) == wanted:
                        selected.write(raw + b"\n")
                        wanted = await anext(failed, None)
                        if wanted is None:
                            break
                if wanted is not None:  # an error line out of input order: finalize writes none
                    log.warning("retry: error lines not found in the input", extra={"batch_id": batch_id})
                size = selected.tell()
                if size == 0:
                    raise nothing
                selected.seek(0)
                name = f"{batch_id}_retry.jsonl"
                uploaded = await self.files.upload(project, selected, size, name, "batch")
        parents = {k: v for k, v in (parent.metadata or {}).items() if k != RETRY_OF}
        kept = list(parents.items())[: MAX_METADATA_PAIRS - 1]
        params = BatchCreateParams(
            input_file_id=uploaded.id,
            endpoint=parent.endpoint,
            completion_window=parent.completion_window,
            metadata={**dict(kept), RETRY_OF: batch_id},
            priority=parent.priority,
            mixed_models=parent.mixed_models or None,  # lines of several models stay allowed
            **parent.defaults.model_dump(),
        )
        return await self.batches.create(project, params)


async def _failed_custom_ids(
    errors: AsyncIterator[bytes], codes: Sequence[str] | None
) -> AsyncGenerator[str]:
    """The custom_ids of the error lines (with one of ``codes``), in the error file's order. A
    line without one (unreadable) names no input line: it is skipped, or the walk would wait for
    it to the end of the input."""
    wanted = [c for c in codes or [] if c.strip()]
    async for line in error_lines(errors):
        if line.custom_id and (not wanted or any(matches(line, None, code) for code in wanted)):
            yield line.custom_id


def _custom_id(raw: bytes) -> str | None:
    try:
        value = orjson.loads(raw).get("custom_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) else None
