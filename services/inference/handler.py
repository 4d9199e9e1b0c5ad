"""One request message in, one result message out: defaults, expiry, cancellation, the engine's
answer, and bounded retries of an engine failure that may pass."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt, wait_random_exponential

from services.inference import metrics
from services.inference.adapters import AdapterSlots
from services.inference.control import BatchControl
from services.inference.engine import (
    GENERATE_ENDPOINTS,
    RESPONSES,
    Answer,
    Engine,
    EngineUnavailable,
    RequestAborted,
    error_answer,
)
from services.inference.line_progress import LineProgress
from services.inference.scheduler import EngineScheduler
from services.inference.settings import InferenceSettings, worker_defaults
from shared import media
from shared.expected_output import LONGEST, expected_length
from shared.protocol.messages import (
    LineError,
    NotRunCode,
    RequestDefaults,
    RequestMessage,
    ResponsePayload,
    ResultMessage,
    raw_json,
)
from shared.retries import RetryRule, first_then_retrying
from shared.settings import MediaSettings

log = logging.getLogger(__name__)

# A default's field -> the body field it fills when the body leaves it unset.
_SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
_MAX_OUTPUT_FIELD = "max_output_tokens"  # a Responses body's name for it


def apply_defaults(url: str, body: dict[str, Any], defaults: RequestDefaults | None) -> None:
    """Fill sampling fields the body does not set (in place). Embeddings, score and rerank take
    none of them."""
    if defaults is None or url not in GENERATE_ENDPOINTS:
        return
    for source, field in _SAMPLING_FIELDS.items():
        value = getattr(defaults, source)
        if value is not None and body.get(field) is None:
            body[field] = value
    if defaults.max_decoding_length is None:
        return
    if url == RESPONSES:
        if body.get(_MAX_OUTPUT_FIELD) is None:
            body[_MAX_OUTPUT_FIELD] = defaults.max_decoding_length
    elif all(body.get(f) is None for f in _MAX_TOKEN_FIELDS):
        body["max_tokens"] = defaults.max_decoding_length


def context_limit(body: dict[str, Any], defaults: RequestDefaults | None) -> int | None:
    """The prompt + output cap: the body's ``max_context_length`` (removed) or the batch's."""
    own = body.pop("max_context_length", None)
    if isinstance(own, int) and not isinstance(own, bool) and own > 0:
        return own
    return defaults.max_context_length if defaults else None


def never_ran(message: RequestMessage, error: LineError) -> ResultMessage:
    """A result for a line that was not run (expired, cancelled, or not a valid request)."""
    return ResultMessage(
        request_id=message.request_id,
        custom_id=message.custom_id,
        batch_id=message.batch_id,
        line=message.line,
        response=None,
        error=error,
    )


def answered(message: RequestMessage, answer: Answer, run_id: str) -> ResultMessage:
    """The result of a line the engine answered, or that was refused before it ran (as the
    engine would refuse it: a status and an error body)."""
    return ResultMessage(
        request_id=message.request_id,
        custom_id=message.custom_id,
        batch_id=message.batch_id,
        line=message.line,
        usage=answer.usage,
        response=ResponsePayload(status_code=answer.status, request_id=run_id, body=raw_json(answer.body)),
        error=None,
    )


@dataclass(frozen=True)
class EngineRetry:
    """How often a line is tried when the engine fails for a reason that may pass (a 5xx answer:
    overloaded, restarting, internal error; or an exception), and how long to wait in between
    (random exponential: ``wait_s`` doubling, at most ``max_wait_s``). A 4xx is never retried."""

    attempts: int
    wait_s: float
    max_wait_s: float

    def retrying(self, context: dict[str, Any]) -> AsyncRetrying:
        """One line's retry loop (what it retries is ``ENGINE_RETRY``); ``context`` names the
        line in the logs."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_random_exponential(multiplier=self.wait_s, max=self.max_wait_s),
            before_sleep=partial(_log_retry, context),
            retry_error_callback=partial(_give_up, context),
        )

    @classmethod
    def from_settings(cls, settings: InferenceSettings) -> EngineRetry:
        return cls(
            attempts=max(1, settings.engine_attempts),
            wait_s=settings.engine_retry_wait_s,
            max_wait_s=settings.engine_retry_max_wait_s,
        )


def _transient(answer: Answer) -> bool:
    return answer.transient


# An engine failure that may pass: a 5xx answer, or any exception but a stop (an abort) or the
# engine's death.
ENGINE_RETRY: RetryRule[Answer] = RetryRule(
    errors=(Exception,), except_errors=(RequestAborted, EngineUnavailable), result=_transient
)


class RequestHandler:
    """Turns request messages into result messages by running them on one engine, each in a place
    the scheduler gives it (``scheduler.py``: which line runs next, and which make way).

    With a ``BatchControl`` it knows which batches are cancelled: their lines are answered
    ``batch_cancelled`` without running, and ``cancel_batch`` aborts the ones running (the
    engine's ``run`` then raises ``RequestAborted``, see the cancellation rule in ``engine.py``).
    """

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.time,
        control: BatchControl | None = None,
        retry: EngineRetry | None = None,
        scheduler: EngineScheduler | None = None,
        media_domains: frozenset[str] | None = None,
        settings: InferenceSettings | None = None,
        progress: LineProgress | None = None,
    ) -> None:
        """The retry, the scheduler and the adapter slots as ``settings`` say (without settings,
        their defaults) unless given; ``progress`` learns when each batch line runs
        (``line_progress.py``)."""
        settings = settings if settings is not None else worker_defaults()
        self.engine = engine
        self.media_domains = MediaSettings().domains if media_domains is None else media_domains
        self.adapters = AdapterSlots(settings.max_loras)
        self.clock = clock
        self.control = control if control is not None else BatchControl(clock)
        self.retry = retry or EngineRetry.from_settings(settings)
        self.scheduler = scheduler if scheduler is not None else EngineScheduler(engine, settings)
        if progress is None:
            progress = LineProgress(engine.max_running if engine.queues else 0, engine.step_cost)
        self.progress = progress
        self.priority_order = settings.scheduling_policy == "priority"  # the engine's queue's

    def stop_waiting(self) -> None:
        """A shutdown: the lines waiting for a place leave without an answer (uncommitted, so
        they are redone elsewhere); only the lines on the engine are drained."""
        self.scheduler.stop_waiting()

    async def cancel_batch(self, batch_id: str) -> None:
        """Abort the batch's requests in flight; each is then answered ``batch_cancelled``, as
        are its lines waiting for a place."""
        await self.scheduler.cancel(batch_id)

    def _never_run_reason(self, message: RequestMessage) -> NotRunCode | None:
        if self.control.cancelled(message.batch_id):
            return "batch_cancelled"
        deadline = message.expires_at or self.control.expires_at(message.batch_id)
        if deadline is not None and self.clock() >= deadline:
            return "batch_expired"
        return None

    async def handle(self, message: RequestMessage) -> ResultMessage:
        """Never raises for a bad request.

        Raises ``CancelledError`` when the awaiting task is cancelled (a shutdown): such a
        request has no answer and is redone elsewhere. ``EngineUnavailable`` passes through.
        """
        reason = self._never_run_reason(message)
        if reason is not None:
            metrics.LINES.by_status[reason] += 1
            return never_ran(message, LineError.not_run(reason))
        # A batch line runs here only with the api's signature (intake.py), and the api's
        # validation refused its media URLs; a pipeline's request is checked here.
        refusal = None if message.batch_id else media.first_refusal(message.body, self.media_domains)
        if refusal is not None:
            param, text = refusal
            answer = error_answer(text, param=param)
            self._count(answer)
            return answered(message, answer, message.request_id)
        try:
            run_id, answer = await self._run(message)
        except RequestAborted:  # cancel_batch aborted it: a cancelled batch's line
            metrics.LINES.by_status["batch_cancelled"] += 1
            return never_ran(message, LineError.not_run("batch_cancelled"))
        self._count(answer)
        return answered(message, answer, run_id)

    async def _run(self, message: RequestMessage) -> tuple[str, Answer]:
        """The line in a place on the engine (``scheduler.py``), the engine's answer, and the id
        of the run that gave it. A run aborted to make room for a young line runs again in a new
        place unless its batch is cancelled; any other ``RequestAborted`` passes through."""
        again = False
        expected = self._expected_length(message)
        while True:
            async with self.scheduler.place(message.batch_id, message.project, again) as place:
                answer: Answer | None = None
                order = place.priority if self.priority_order else 0
                self.progress.started(place.run_id, message.batch_id, expected, order)
                try:
                    answer = await self._answer(message, place.run_id, place.priority)
                    return place.run_id, answer
                except RequestAborted:
                    if not self.scheduler.preempted(place.run_id) or self.control.cancelled(message.batch_id):
                        raise
                    metrics.PREEMPTED.inc()
                finally:
                    ok = answer is not None and answer.ok
                    self.progress.ended(place.run_id, answered=answer is not None, ok=ok)
            again = True

    @staticmethod
    def _expected_length(message: RequestMessage) -> int | None:
        """A batch line's expected output tokens (``shared/expected_output.py``), for the batch's
        progress; None for a pipeline's request or a line without an output cap."""
        if message.batch_id is None:
            return None
        default = message.defaults.max_decoding_length if message.defaults else None
        length = expected_length(message.url, message.body, default)
        return None if length == LONGEST else length

    async def _answer(self, message: RequestMessage, run_id: str, priority: int) -> Answer:
        """The engine's answer, tried again (bounded, with jitter) while it fails in a way that
        may pass; after the last try, its last 5xx answer (or a 500 for an exception). Raises
        ``RequestAborted`` when the line's batch is cancelled, or the scheduler preempts the run,
        between tries."""
        body = dict(message.body)
        apply_defaults(message.url, body, message.defaults)
        limit = context_limit(body, message.defaults)
        if body.get("model") in self.engine.adapters:  # an adapter's line keeps its name
            self.adapters.use(body["model"])
        else:
            body["model"] = self.engine.model_id

        async def attempt() -> Answer:
            if self.control.cancelled(message.batch_id) or self.scheduler.preempted(run_id):
                raise RequestAborted(run_id)  # cancelled, or preempted, while waiting to try again
            return await self.engine.run(
                message.url, body, run_id, max_context_length=limit, priority=priority
            )

        def retrying() -> AsyncRetrying:  # built only when the first try failed
            return self.retry.retrying({"batch_id": message.batch_id, "custom_id": message.custom_id})

        return await first_then_retrying(attempt, ENGINE_RETRY, retrying)

    @staticmethod
    def _count(answer: Answer) -> None:
        lines = metrics.LINES
        lines.by_status[str(answer.status)] += 1
        if answer.ok and answer.usage is not None:
            lines.prompt_tokens += answer.usage.prompt_tokens
            lines.generated_tokens += answer.usage.completion_tokens


def _log_retry(context: dict[str, Any], state: RetryCallState) -> None:
    outcome = state.outcome
    failed = outcome is not None and outcome.failed
    metrics.ENGINE_RETRIES.labels(reason="exception" if failed else "5xx").inc()
    if outcome is None:
        what = "?"
    elif failed:
        what = repr(outcome.exception())
    else:
        what = f"status {outcome.result().status}"
    log.warning("engine failed on a request (try %d): %s", state.attempt_number, what, extra=context)


def _give_up(context: dict[str, Any], state: RetryCallState) -> Answer:
    """After the last try: its 5xx answer, or a 500 envelope for an exception."""
    metrics.ENGINE_GAVE_UP.inc()
    outcome = state.outcome
    if outcome is not None and not outcome.failed:
        return outcome.result()  # type: ignore[no-any-return]
    log.error(
        "engine failed on a request; giving up: %r", outcome.exception() if outcome else None, extra=context
    )
    return error_answer("The engine failed on this request.", 500)
