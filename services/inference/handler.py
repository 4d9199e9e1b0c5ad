"""One request message in, one result message out: defaults, expiry, cancellation, the engine's answer."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from services.inference import metrics
from services.inference.control import BatchControl
from services.inference.engine import GENERATE_ENDPOINTS, Engine, EngineUnavailable, error_body
from shared.ids import new_id
from shared.protocol.messages import (
    LineError,
    RequestMessage,
    ResponsePayload,
    ResultMessage,
    SamplingDefaults,
)

log = logging.getLogger(__name__)

# SamplingDefaults field -> the body field it fills when the body leaves it unset.
_SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


def apply_defaults(url: str, body: dict[str, Any], defaults: SamplingDefaults | None) -> None:
    """Fill sampling fields the body does not set (in place). Embeddings take none of them."""
    if defaults is None or url not in GENERATE_ENDPOINTS:
        return
    for source, field in _SAMPLING_FIELDS.items():
        value = getattr(defaults, source)
        if value is not None and body.get(field) is None:
            body[field] = value
    if defaults.max_decoding_length is not None and all(body.get(f) is None for f in _MAX_TOKEN_FIELDS):
        body["max_tokens"] = defaults.max_decoding_length


def context_limit(body: dict[str, Any], defaults: SamplingDefaults | None) -> int | None:
    """The prompt + output cap: the body's ``max_context_length`` (removed) or the batch's."""
    own = body.pop("max_context_length", None)
    if isinstance(own, int) and not isinstance(own, bool) and own > 0:
        return own
    return defaults.max_context_length if defaults else None


def never_ran(message: RequestMessage, code: str, text: str) -> ResultMessage:
    """A result for a line that was not run (expired, cancelled, or not a valid request)."""
    return ResultMessage(
        request_id=message.request_id,
        custom_id=message.custom_id,
        batch_id=message.batch_id,
        line=message.line,
        response=None,
        error=LineError(code=code, message=text),
    )


EXPIRED_TEXT = "This request could not be executed before the completion window expired."
CANCELLED_TEXT = "This request was not executed because the batch was cancelled."


class RequestHandler:
    """Turns request messages into result messages by running them on one engine.

    With a ``BatchControl`` it knows which batches are cancelled: their lines are answered
    ``batch_cancelled`` without running, and ``cancel_batch`` aborts the ones running.
    """

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.time,
        control: BatchControl | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.control = control if control is not None else BatchControl(clock)
        self._running: dict[str, set[str]] = {}  # batch id -> engine request ids in flight

    def running(self, batch_id: str) -> int:
        return len(self._running.get(batch_id, ()))

    async def cancel_batch(self, batch_id: str) -> None:
        """Abort the batch's requests in flight; each is then answered ``batch_cancelled``."""
        run_ids = list(self._running.get(batch_id, ()))
        if run_ids:
            log.info(
                "aborting a cancelled batch's requests", extra={"batch_id": batch_id, "count": len(run_ids)}
            )
        for run_id in run_ids:
            await self.engine.abort(run_id)

    def _never_run_reason(self, message: RequestMessage) -> tuple[str, str] | None:
        if self.control.cancelled(message.batch_id):
            return "batch_cancelled", CANCELLED_TEXT
        deadline = message.expires_at or self.control.expires_at(message.batch_id)
        if deadline is not None and self.clock() >= deadline:
            return "batch_expired", EXPIRED_TEXT
        return None

    async def handle(self, message: RequestMessage) -> ResultMessage:
        """Never raises for a bad request.

        Raises ``CancelledError`` when the run is aborted for any reason but its batch's
        cancellation (a shutdown): such a request has no answer and is redone elsewhere.
        """
        reason = self._never_run_reason(message)
        if reason is not None:
            metrics.REQUESTS.labels(status=reason[0]).inc()
            return never_ran(message, *reason)
        run_id = new_id("req_")
        batch_id = message.batch_id
        if batch_id:
            self._running.setdefault(batch_id, set()).add(run_id)
        metrics.STARTED.inc()
        try:
            status, body = await self._run(message, run_id)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if (current is not None and current.cancelling()) or not self.control.cancelled(batch_id):
                raise
            metrics.REQUESTS.labels(status="batch_cancelled").inc()
            return never_ran(message, "batch_cancelled", CANCELLED_TEXT)
        finally:
            if batch_id:
                self._forget_run(batch_id, run_id)
        self._count(status, body)
        return ResultMessage(
            request_id=message.request_id,
            custom_id=message.custom_id,
            batch_id=message.batch_id,
            line=message.line,
            response=ResponsePayload(status_code=status, request_id=run_id, body=body),
            error=None,
        )

    def _forget_run(self, batch_id: str, run_id: str) -> None:
        runs = self._running.get(batch_id)
        if runs is not None:
            runs.discard(run_id)
            if not runs:
                del self._running[batch_id]

    async def _run(self, message: RequestMessage, run_id: str) -> tuple[int, dict[str, Any]]:
        body = dict(message.body)
        apply_defaults(message.url, body, message.defaults)
        limit = context_limit(body, message.defaults)
        body["model"] = self.engine.model_id
        try:
            return await self.engine.run(message.url, body, run_id, max_context_length=limit)
        except (asyncio.CancelledError, EngineUnavailable):
            raise
        except Exception:
            log.exception(
                "engine failed on a request",
                extra={"batch_id": message.batch_id, "custom_id": message.custom_id},
            )
            return 500, error_body("The engine failed on this request.", 500)

    @staticmethod
    def _count(status: int, body: dict[str, Any]) -> None:
        metrics.REQUESTS.labels(status=str(status)).inc()
        usage = body.get("usage") if status == 200 else None
        if isinstance(usage, dict):
            metrics.PROMPT_TOKENS.inc(usage.get("prompt_tokens") or 0)
            metrics.GENERATED_TOKENS.inc(usage.get("completion_tokens") or 0)
