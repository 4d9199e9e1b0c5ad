"""Batches: create (validate, then emit), read, list and cancel, scoped to a project."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any, Literal

import orjson
import urllib3
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from pymongo.errors import ConnectionFailure
from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential_jitter

from services.api.announcer import ControlAnnouncer
from services.api.dispatch.loop import Dispatcher
from services.api.dispatch.settings import DispatchSettings
from services.api.quotas.limits import ModelUse
from services.api.quotas.service import QuotaService
from services.api.schemas import BatchCreateParams
from services.api.service.dispatch_order import NO_GROUPS, OrderBuilder, PartOrders, save_order, save_parts
from services.api.service.files import FileService, page
from services.api.service.idempotency import CreateDeduplicator
from services.api.service.validation import InputValidator
from shared import ids
from shared.documents import BatchDocument, FileDocument, sort_key
from shared.errors import Conflict, InvalidRequest, NotFound, QuotaExceeded, echo
from shared.input_lines import request_lines
from shared.lifecycle import TERMINAL
from shared.protocol.batch_input import UTF8_BOM
from shared.protocol.messages import ControlMessage
from shared.protocol.openai import Batch, BatchError, ListObject
from shared.released_files import purge_if_released
from shared.settings import ApiSettings, MediaSettings
from shared.storage import ObjectStore
from shared.stores.batches import BatchStore
from shared.stores.idempotency import IdempotencyStore
from shared.stores.models import ModelStore

log = logging.getLogger(__name__)

# Outages: retried, then left for the next start (never the batch's fault, never its failure).
DEPENDENCY_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionFailure,
    KafkaConnectionError,
    KafkaTimeoutError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
)

MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InvalidRequest(
            "metadata must be an object of string keys and string values.",
            param="metadata",
            code="invalid_type",
        )
    if len(metadata) > MAX_METADATA_PAIRS or any(
        len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE for k, v in metadata.items()
    ):
        raise InvalidRequest(
            f"metadata allows at most {MAX_METADATA_PAIRS} pairs, keys up to {MAX_METADATA_KEY} "
            f"characters and values up to {MAX_METADATA_VALUE}.",
            param="metadata",
            code="invalid_value",
        )
    return metadata


class BatchService:
    def __init__(
        self,
        batches: BatchStore,
        models: ModelStore,
        claims: IdempotencyStore,
        store: ObjectStore,
        files: FileService,
        announcer: ControlAnnouncer,
        dispatcher: Dispatcher,
        settings: ApiSettings,
        dispatch: DispatchSettings,
        media: MediaSettings | None = None,
        quotas: QuotaService | None = None,
    ) -> None:
        self.batches = batches
        self.models = models
        self.store = store
        self.files = files
        self.announcer = announcer
        self.dispatcher = dispatcher
        self.settings = settings
        self.dispatch = dispatch
        self.media_domains = (media or MediaSettings()).domains
        self.quotas = quotas  # None: no quotas
        self.dedupe = CreateDeduplicator(claims, batches, settings.create_dedupe_window_s)
        self._tasks: set[asyncio.Task[None]] = set()

    async def create(
        self,
        project: str,
        params: BatchCreateParams,
        idempotency_key: str | None = None,
        api: Literal["openai", "anthropic"] = "openai",
    ) -> Batch:
        window = params.checked_window_s()
        metadata = check_metadata(params.metadata)
        input_file = await self.files.document(project, params.input_file_id)
        if input_file.purpose != "batch":
            raise InvalidRequest(
                f"File {params.input_file_id} has purpose {input_file.purpose!r}, not 'batch'.",
                param="input_file_id",
                code="invalid_value",
            )
        batch_id = ids.batch_id()
        earlier = await self.dedupe.claim(project, params.model_dump(), idempotency_key, batch_id)
        if earlier is not None:
            log.info("deduplicated a repeated create", extra={"batch_id": earlier})
            return await self.get(project, earlier)
        now = int(time.time())
        batch = BatchDocument(
            _id=batch_id,
            project=project,
            endpoint=params.endpoint,
            input_file_id=params.input_file_id,
            completion_window=params.completion_window,
            status="validating",
            created_at=now,
            sort_key=sort_key(),
            expires_at=now + window,
            metadata=metadata,
            defaults=params.defaults(),
            output_expires_after=(
                params.output_expires_after.model_dump() if params.output_expires_after else None
            ),
            priority=params.priority or 0,
            prefix_order=self.dispatch.prefix_order and params.prefix_order is not False,
            mixed_models=bool(params.mixed_models),
            api=api,
        )
        release = functools.partial(
            self.dedupe.release, project, params.model_dump(), idempotency_key, batch_id
        )
        try:
            await self._check_quotas(batch, input_file)
        except Exception:  # refused, or an outage: a retry of this create may claim the slot
            with contextlib.suppress(Exception):
                await release()
            raise
        await self.batches.insert(batch)
        if self.quotas is not None:
            try:  # counted again with itself in: racing creates never pass a limit together
                await self.quotas.admit(project)
            except QuotaExceeded:
                await self.batches.withdraw(batch_id)
                await release()
                raise
        self.start_processing(batch, input_file)
        return batch.public()

    async def _check_quotas(self, batch: BatchDocument, input_file: FileDocument) -> None:
        """429 when the batch's project is at a quota a create checks (services/api/quotas); the
        per-model ones for the model the file's first line names."""
        if self.quotas is None:
            return
        model = None
        if not batch.mixed_models and self.quotas.counts_queue(batch.project):
            model = await self._first_model(input_file)
        await self.quotas.check_create(batch.project, model)

    async def _first_model(self, input_file: FileDocument) -> str | None:
        """The model the input file's first request line names (None when it names none): the
        model whose queue a create is checked against (validation checks every line)."""
        # Held to the line limit: a longer first line comes empty (``oversize``) and names no model.
        lines = request_lines(self.store.iter_chunks(input_file.object_key), self.settings.max_line_bytes)
        try:
            async for line in lines:
                item = orjson.loads(line.raw.removeprefix(UTF8_BOM))
                body = item.get("body") if isinstance(item, dict) else None
                model = body.get("model") if isinstance(body, dict) else None
                return model if isinstance(model, str) else None
        except orjson.JSONDecodeError:
            return None
        finally:
            await lines.aclose()  # type: ignore[attr-defined]
        return None

    async def document(self, project: str, batch_id: str) -> BatchDocument:
        batch = await self.batches.get(batch_id, project)
        if batch is None:
            raise NotFound.no_such("Batch", batch_id, "batch_id")
        return batch

    async def get(self, project: str, batch_id: str) -> Batch:
        return (await self.document(project, batch_id)).public()

    async def list_page(
        self, project: str, after: str | None, limit: int, statuses: Collection[str] | None = None
    ) -> ListObject:
        anchor = (await self.document(project, after)).sort_key if after else None
        docs = await self.batches.page(project, anchor, limit + 1, statuses)
        return page([d.public() for d in docs], limit, self.settings.max_list_bytes)

    async def cancel(self, project: str, batch_id: str) -> Batch:
        """Idempotent: a retried cancel (say after a 503) gets the batch, and announces again in
        case the first announcement never reached Kafka; only a batch that ended otherwise is 409."""
        batch = await self.document(project, batch_id)
        if batch.status == "cancelled":
            return batch.public()
        if batch.status in TERMINAL:
            raise Conflict(
                f"Cannot cancel a batch with status {batch.status!r}.",
                code="batch_not_cancellable",
            )
        if batch.status != "cancelling":
            await self.batches.request_cancel(batch_id)
        await self.announcer.announce(ControlMessage(batch_id=batch_id, model=batch.model, cancelled=True))
        return await self.get(project, batch_id)

    # Background work: validation and emission run after the create call has answered.

    def start_processing(self, batch: BatchDocument, input_file: FileDocument | None = None) -> None:
        task = asyncio.create_task(self._process(batch, input_file), name=f"process-{batch.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def recover(self) -> None:
        """Resume batches a previous api process left validating or half emitted."""
        for batch in await self.batches.unfinished_work():
            log.info("resuming batch", extra={"batch_id": batch.id})
            self.start_processing(batch)

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _process(self, batch: BatchDocument, input_file: FileDocument | None) -> None:
        """Validate one batch and hand it to the dispatcher; whatever goes wrong stays with this batch.

        An error is retried ``process_attempts`` times with backoff; then an outage of a
        dependency leaves the batch for the next start, and any other error ends it ``failed``
        with the error named. Starts are counted in the batch document, so a batch that brings
        the process down (or never finishes) ends ``failed`` after ``process_max_starts``.
        """
        try:
            starts = await self.batches.count_attempt(batch.id)
            if starts > self.settings.process_max_starts:
                await self._give_up(batch, f"its processing was started {starts - 1} times and never ended")
                return
            wait_s = self.settings.process_retry_wait_s
            retrying = AsyncRetrying(
                stop=stop_after_attempt(self.settings.process_attempts),
                wait=wait_exponential_jitter(multiplier=wait_s, max=30, jitter=wait_s),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        batch, input_file = await self._reload(batch), None
                    await self._process_once(batch, input_file)
        except asyncio.CancelledError:
            raise
        except DEPENDENCY_ERRORS:
            log.exception(
                "a dependency is unavailable; the batch resumes on restart", extra={"batch_id": batch.id}
            )
        except Exception as exc:
            log.exception("processing a batch failed; the batch fails", extra={"batch_id": batch.id})
            await self._give_up(batch, echo(f"{type(exc).__name__}: {exc}", quote=False))

    async def _reload(self, batch: BatchDocument) -> BatchDocument:
        return await self.batches.get(batch.id) or batch

    async def _process_once(self, batch: BatchDocument, input_file: FileDocument | None) -> None:
        if batch.status in TERMINAL:  # ended by a try that failed after the move: its webhook
            await self.batches.announce_end(batch)  # event again (recorded once)
            return
        if input_file is None:
            input_file = await self.files.documents.get(batch.input_file_id)
        if batch.status == "validating":
            started = await self._validate(batch, input_file)
            if started is None:
                return
            batch = started
        if batch.status != "in_progress" or batch.dispatchable:
            return
        # The workers' and aggregator's batch facts (again on a retry: the topic is compacted).
        await self.announcer.announce(
            ControlMessage(
                batch_id=batch.id,
                model=batch.model,
                total=batch.request_counts.total,
                expires_at=batch.expires_at,
            )
        )
        # The dispatcher (services/api/dispatch) streams the lines from the input file.
        await self.batches.mark_dispatchable(batch.id)
        self.dispatcher.wake()

    async def _give_up(self, batch: BatchDocument, reason: str) -> None:
        """End a batch that cannot be processed: ``failed``, saying why; its lines already sent
        are not run (the workers learn it from a cancel on the control topic)."""
        error = BatchError(code="processing_failed", message=f"The batch could not be processed: {reason}")
        current = await self._reload(batch)
        if current.status in TERMINAL:
            return
        await self._fail(current, [error])
        if current.model is not None:
            await self.announcer.announce(
                ControlMessage(batch_id=batch.id, model=current.model, cancelled=True)
            )

    async def _validate(self, batch: BatchDocument, input_file: FileDocument | None) -> BatchDocument | None:
        """Validate the input file; move the batch to in_progress (returned) or failed (None)."""
        if input_file is None:
            await self._fail(
                batch, [BatchError(code="invalid_request", message="The input file was deleted.")]
            )
            return None
        validator = InputValidator(
            endpoint=batch.endpoint,
            known_models=await self.models.served(),
            max_lines=self.settings.max_batch_lines,
            max_reported_errors=self.settings.max_reported_errors,
            max_reported_error_bytes=self.settings.max_reported_error_bytes,
            allowed_media_domains=self.media_domains,
            max_line_bytes=self.settings.max_line_bytes,
            default_length=batch.defaults.max_decoding_length,
        )
        min_shared = self.dispatch.prefix_min_shared_chars
        longest_first = self.dispatch.longest_first and batch.prefix_order
        order, parts = None, None
        if batch.mixed_models:
            min_shared = min_shared if batch.prefix_order else NO_GROUPS
            parts = validator.parts = PartOrders(min_shared, longest_first=longest_first)
        elif batch.prefix_order:
            order = validator.order = OrderBuilder(min_shared, longest_first=longest_first)
        try:
            chunks = self.store.iter_chunks(input_file.object_key)
            report = await validator.run(request_lines(chunks, self.settings.max_line_bytes))
            if not report.ok:
                await self._fail(batch, report.errors)
                log.info(
                    "batch failed validation",
                    extra={"batch_id": batch.id, "errors": report.error_count},
                )
                return None
            if await self._over_quota(batch, report.enqueued):
                return None
            input_key = input_file.object_key
            ordered = order is not None and await save_order(self.store, batch.id, input_key, order)
            stored = None
            if parts is not None:
                stored, ordered = await save_parts(self.store, batch.id, input_key, parts)
        finally:
            for made in (order, parts):
                if made is not None:
                    made.close()  # their temporary files
        if stored is None:  # one model: its base model's workers run every line
            stored = [{"model": report.base, "lines": report.lines}]
        enqueued = {model: use.stored() for model, use in report.enqueued.items()}
        enqueued_at = time.time_ns()
        if not await self.batches.start(
            batch.id,
            report.model,
            report.lines,
            ordered,
            stored,
            enqueued,
            enqueued_at,
            expected_tokens=report.expected_tokens,
        ):
            return None  # cancelled (or ended) meanwhile
        # Counted again against the batches that stored theirs first: the first ones in win.
        if await self._over_quota(batch, report.enqueued, enqueued_at):
            return None
        counts = batch.request_counts.model_copy(update={"total": report.lines})
        return batch.model_copy(
            update={
                "status": "in_progress",
                "model": report.model,
                "request_counts": counts,
                "prefix_order": ordered,
            }
        )

    async def _over_quota(
        self, batch: BatchDocument, mine: Mapping[str, ModelUse], enqueued_at: int | None = None
    ) -> bool:
        """Fail the batch when its lines or tokens would take its project past a per-model quota."""
        if self.quotas is None:
            return False
        refusal = await self.quotas.batch_refusal(batch.project, batch.id, mine, enqueued_at)
        if refusal is None:
            return False
        await self._fail(batch, [BatchError(code=refusal.code, message=refusal.message)])
        extra = {"batch_id": batch.id, "project": batch.project, "limit": refusal.limit}
        log.info("batch failed a quota", extra=extra)
        return True

    async def _fail(self, batch: BatchDocument, errors: list[BatchError]) -> None:
        await self.batches.fail(batch.id, errors)
        await purge_if_released(self.files.documents, self.batches, self.store, batch.input_file_id)
