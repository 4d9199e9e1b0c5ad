"""Message batches (Anthropic's Message Batches API) on the batch pipeline.

A create checks every request at once (each bad one named by its ``custom_id``), writes the
requests as a batch input file (one ``/v1/messages`` line each, its ``body`` the request's
``params``) and creates a batch from it through ``BatchService.create``: the same validation,
quotas, dispatcher, workers, aggregator and webhooks as any batch, with lines that may name
several models (``mixed_models``). Reads render the stored batch as Anthropic's object
(shared/protocol/anthropic.py); results are the batch's output and error lines in Anthropic's
shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import IO, Any

import orjson
from pydantic import ValidationError

from services.api.schemas import BatchCreateParams
from services.api.service.batches import BatchService
from services.api.service.files import FileService
from services.api.service.partial import Kind, PartialOutputService
from shared.documents import BatchDocument
from shared.errors import InvalidRequest, NotFound, QuotaExceeded, echo
from shared.lifecycle import TERMINAL
from shared.protocol.anthropic import (
    ANTHROPIC_API,
    CUSTOM_ID_PATTERN,
    NOT_RUN_RESULTS,
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchCreateParams,
    MessageBatchList,
    message_batch,
    result_line,
)
from shared.protocol.batch_input import BODY_BY_ENDPOINT
from shared.protocol.openai import MESSAGES
from shared.result_chunks import not_run_code
from shared.settings import ApiSettings
from shared.stores.message_batches import MessageBatchStore
from shared.stores.models import ModelStore, ServedModel

INPUT_FILENAME = "message_batch.jsonl"
"""The name of a message batch's input file (its requests as batch lines)."""

NOT_RUN_CACHE = 10_000
"""Ended batches whose never-run counts (read once from the error file) a process keeps."""

_CUSTOM_ID = re.compile(CUSTOM_ID_PATTERN)
_SPOOL_BYTES = 8 * 1024 * 1024  # an input file this small is written from memory
TOO_MANY_CREATES = "too_many_creates"
CREATE_RETRY_AFTER_S = 1
_END_BEING_RECORDED = "Message batch {batch_id} has just ended; its end is being recorded. Try again shortly."


class MessageBatchService:
    def __init__(
        self,
        batches: BatchService,
        files: FileService,
        partial: PartialOutputService,
        store: MessageBatchStore,
        models: ModelStore,
        settings: ApiSettings,
    ) -> None:
        self.batches = batches
        self.files = files
        self.partial = partial
        self.store = store
        self.models = models
        self.settings = settings
        self._not_run: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._creates = asyncio.Semaphore(settings.max_message_batch_creates)

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Room for one more create's body in memory, or 429 ``too_many_creates`` at once: each
        holds its requests in memory (several times its size as Python objects) while checked,
        so at most ``max_message_batch_creates`` run at a time, whichever projects send them."""
        if self._creates.locked():
            raise QuotaExceeded(
                f"{self.settings.max_message_batch_creates} message batch creates are running; "
                "try again shortly.",
                limit="requests",
                code=TOO_MANY_CREATES,
                retry_after_s=CREATE_RETRY_AFTER_S,
            )
        async with self._creates:
            yield

    async def create(self, project: str, body: bytes, results_base: str) -> MessageBatch:
        """Create a message batch from the raw request body. Parsing, the requests' checks and
        writing the input file run in a worker thread: a body of up to
        ``max_message_batch_bytes`` never holds up the api's other calls."""
        params = await asyncio.to_thread(parse_create, body)
        served = await self.models.served()
        await asyncio.to_thread(check_requests, params, served, self.settings)
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
            size = await asyncio.to_thread(_write_lines, params, spool)  # type: ignore[arg-type]
            upload = await self.files.upload(project, spool, size, INPUT_FILENAME, "batch")  # type: ignore[arg-type]
        create = BatchCreateParams(input_file_id=upload.id, endpoint=MESSAGES, mixed_models=True)
        try:
            batch = await self.batches.create(project, create, api=ANTHROPIC_API)
        except Exception:  # refused (a quota) or an outage: no input file is left behind
            with contextlib.suppress(Exception):
                await self.files.delete(project, upload.id)
            raise
        created = await self.get(project, batch.id, results_base)
        if created.request_counts.processing == 0 and created.processing_status == "in_progress":
            # Validating: its total is not stored yet, but every request is still to run.
            created.request_counts.processing = len(params.requests)
        return created

    async def document(self, project: str, batch_id: str) -> BatchDocument:
        """The project's message batch (an OpenAI batch is not one: 404)."""
        batch = await self.batches.batches.get(batch_id, project)
        if batch is None or batch.api != ANTHROPIC_API:
            raise NotFound.no_such("Message batch", batch_id, "message_batch_id")
        return batch

    async def get(self, project: str, batch_id: str, results_base: str) -> MessageBatch:
        return await self._render(await self.document(project, batch_id), results_base)

    async def _render(self, batch: BatchDocument, results_base: str) -> MessageBatch:
        not_run = await self._not_run_counts(batch) if batch.status in TERMINAL else None
        return message_batch(batch, not_run, f"{results_base}/{batch.id}/results")

    async def list_page(
        self,
        project: str,
        limit: int,
        after_id: str | None,
        before_id: str | None,
        results_base: str,
    ) -> MessageBatchList:
        """Newest first; ``after_id``: the page after (older than) that batch; ``before_id``: the
        page before (newer than) it."""
        if before_id is not None:
            anchor = (await self.document(project, before_id)).sort_key
            docs = await self.store.page(project, limit + 1, newer_than=anchor)
            more, docs = len(docs) > limit, docs[-limit:]
        else:
            older = (await self.document(project, after_id)).sort_key if after_id else None
            docs = await self.store.page(project, limit + 1, older_than=older)
            more, docs = len(docs) > limit, docs[:limit]
        data = [await self._render(d, results_base) for d in docs]
        return MessageBatchList(
            data=data,
            has_more=more,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
        )

    async def cancel(self, project: str, batch_id: str, results_base: str) -> MessageBatch:
        await self.document(project, batch_id)
        await self.batches.cancel(project, batch_id)
        return await self.get(project, batch_id, results_base)

    async def delete(self, project: str, batch_id: str) -> DeletedMessageBatch:
        """Remove an ended message batch with its input, output and error files; one still
        processing must be canceled first (400, as Anthropic's)."""
        batch = await self.document(project, batch_id)
        if batch.status not in TERMINAL:
            raise InvalidRequest(
                f"Message batch {batch_id} is still processing; cancel it before deleting it.",
                param="message_batch_id",
            )
        if batch.end_recorded is False:  # ended, its end event not recorded yet: touch nothing
            raise InvalidRequest(_END_BEING_RECORDED.format(batch_id=batch_id), param="message_batch_id")
        # Its files first: an outage midway leaves the batch, and the delete can be sent again.
        for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
            if file_id:
                with contextlib.suppress(NotFound):  # already gone (deleted or expired)
                    await self.files.delete(project, file_id)
        if not await self.store.delete_ended(batch_id, project):
            raise InvalidRequest(_END_BEING_RECORDED.format(batch_id=batch_id), param="message_batch_id")
        self._not_run.pop(batch_id, None)
        return DeletedMessageBatch(id=batch_id)

    async def results(self, project: str, batch_id: str) -> AsyncIterator[bytes]:
        """Open the results (404 or 400 before any byte is sent): the output file's lines, then
        the error file's, each in Anthropic's shape."""
        batch = await self.document(project, batch_id)
        if batch.status not in TERMINAL:
            raise InvalidRequest(
                f"Message batch {batch_id} has not ended; its results are available once it has.",
                param="message_batch_id",
            )
        output = await self.partial.open(project, batch_id, "output")
        errors = await self.partial.open(project, batch_id, "error")
        return self._results(output, errors)

    async def _results(self, *files: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        for chunks in files:
            async for raw in _lines(chunks):
                line = result_line(raw)
                if line is not None:
                    yield line

    async def _not_run_counts(self, batch: BatchDocument) -> dict[str, int]:
        """How many of an ended batch's lines never ran, by code: as finalize counted them, or for a
        batch without those counts, read from its error file once."""
        if batch.not_run_counts is not None:
            return batch.not_run_counts
        cached = self._not_run.get(batch.id)
        if cached is not None:
            return cached
        counts = dict.fromkeys(NOT_RUN_RESULTS, 0)
        if batch.error_file_id:
            errors: Kind = "error"
            async for raw in _lines(await self.partial.open(batch.project, batch.id, errors)):
                if (code := not_run_code(raw)) is not None:
                    counts[code] += 1
        self._not_run[batch.id] = counts
        if len(self._not_run) > NOT_RUN_CACHE:
            self._not_run.popitem(last=False)
        return counts


def _write_lines(params: MessageBatchCreateParams, out: IO[bytes]) -> int:
    """The requests as batch input lines (``/v1/messages``, ``body`` = ``params``); returns the
    bytes written, ``out`` rewound."""
    for request in params.requests:
        line = {"custom_id": request.custom_id, "method": "POST", "url": MESSAGES, "body": request.params}
        out.write(orjson.dumps(line) + b"\n")
    size = out.tell()
    out.seek(0)
    return size


def parse_create(body: bytes) -> MessageBatchCreateParams:
    """The create's body (400 naming the field for a body that is not one)."""
    try:
        return MessageBatchCreateParams.model_validate(orjson.loads(body))
    except orjson.JSONDecodeError:
        raise InvalidRequest("The request body is not valid JSON.") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        where = echo(".".join(map(str, error["loc"])) or "body", quote=False)  # the client's keys
        if error["type"] == "extra_forbidden":
            raise InvalidRequest(f"{where}: Extra inputs are not permitted.", param=where) from None
        raise InvalidRequest(f"{where}: {error['msg']}.", param=where) from None


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``\\n``-separated lines of a byte stream (a result's text may hold other separators)."""
    rest = b""
    async for chunk in chunks:
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            yield line
    if rest:
        yield rest


def check_requests(
    params: MessageBatchCreateParams, known_models: Mapping[str, ServedModel], settings: ApiSettings
) -> None:
    """Refuse the create (400) naming every bad request by its index and ``custom_id``, the first
    ``max_reported_errors`` of them: a bad or repeated ``custom_id``, ``params`` that are not a
    Messages request (``messages``, ``max_tokens``), a model no worker serves, ``stream``, an
    output cap past the model's context, a request over the line limit."""
    requests = params.requests
    if not requests:
        raise InvalidRequest("requests: at least one request is required.", param="requests")
    if len(requests) > settings.max_batch_lines:
        raise InvalidRequest(
            f"requests: {len(requests)} requests; the limit is {settings.max_batch_lines}.", param="requests"
        )
    problems: list[str] = []
    seen: set[str] = set()
    for index, request in enumerate(requests):
        found = _request_problems(request.custom_id, request.params, known_models, settings, seen)
        if found:
            name = f"requests[{index}] (custom_id {echo(request.custom_id)})"
            problems.append(f"{name}: {'; '.join(found)}")
    if problems:
        shown = problems[: settings.max_reported_errors]
        more = len(problems) - len(shown)
        tail = f" … and {more} more." if more else ""
        raise InvalidRequest(
            f"{len(problems)} invalid request{'s' if len(problems) > 1 else ''}: " + " | ".join(shown) + tail,
            param="requests",
        )


def _request_problems(
    custom_id: Any,
    params: Any,
    known_models: Mapping[str, ServedModel],
    settings: ApiSettings,
    seen: set[str],
) -> list[str]:
    found: list[str] = []
    if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
        found.append("custom_id must be 1 to 64 letters, digits, '_' or '-'")
    elif custom_id in seen:
        found.append("custom_id is not unique in the batch")
    else:
        seen.add(custom_id)
    if not isinstance(params, dict):
        return [*found, "params must be an object"]
    if params.get("stream"):
        found.append("params.stream: streaming is not supported in a batch")
    model = params.get("model")
    known = known_models.get(model) if isinstance(model, str) else None
    if not isinstance(model, str) or not model:
        found.append("params.model: Field required")
    elif known is None:
        found.append(f"params.model: the model {echo(model)} does not exist")
    shape, required = BODY_BY_ENDPOINT[MESSAGES]
    missing = shape.missing(params, required)
    if missing is not None:
        found.append(f"params.{missing}: Field required")
    else:
        try:
            shape.model_validate(params)
        except ValidationError as exc:
            found += [
                f"params.{echo('.'.join(map(str, e['loc'])), quote=False)}: {e['msg']}"
                for e in exc.errors()[:5]
            ]
    max_tokens = params.get("max_tokens")
    context = known.max_context_length if known else None
    if context and isinstance(max_tokens, int) and max_tokens > context:
        found.append(f"params.max_tokens: {max_tokens} exceeds the model's context length of {context}")
    try:
        size = len(orjson.dumps(params)) + len(str(custom_id)) + 64
    except orjson.JSONEncodeError:
        return [*found, "params are nested too deeply to be sent on"]
    if size > settings.max_line_bytes:
        found.append(f"the request is {size} bytes; the limit is {settings.max_line_bytes} bytes per request")
    return found
