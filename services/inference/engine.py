"""The engine contract: what the worker asks of an engine, and the types they speak.

An engine serves one model. It answers a request like vLLM's OpenAI server would: an HTTP-like
status code and the exact JSON body (a ``chat.completion``, ``text_completion``, ``response``,
embedding or score ``list``, or a rerank answer; or an error envelope), as raw JSON bytes, with
the token usage beside it. It never raises for a bad request: a client mistake is a 4xx answer,
so the worker goes on.

The cancellation rule, which every engine enforces itself (each runs every request through
``RunRegistry``, below), so that nobody above it has to check again:

    A request that is stopped before it finishes has no answer. ``run`` never returns one for it.
    ``abort(request_id)`` makes that request's ``run`` raise ``RequestAborted``; cancelling the
    task that awaits ``run`` makes it raise ``asyncio.CancelledError`` (that wins when both
    happen). vLLM's serving code turns a cancellation into a "client disconnected" error body:
    an engine must not pass that body on as the request's answer.

So the worker publishes a result only for an answer, answers ``batch_cancelled`` for a request it
aborted because its batch was cancelled, and leaves a cancelled request (a shutdown) unpublished
and uncommitted for the next owner.

Failures that are not the request's: ``EngineUnavailable`` (the engine died; the worker exits)
and a 5xx answer (overloaded, restarting, an internal error: may pass, so the worker retries it a
bounded number of times). A 4xx answer is the request's own fault and is final.

This module imports no engine: ``engine_factory.open_engine`` builds one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol, runtime_checkable

import orjson

from services.inference.settings import InferenceSettings
from services.inference.sim_gpu import PROFILE
from shared.protocol.messages import TokenUsage
from shared.protocol.openai import (  # noqa: F401 (the endpoints the contract serves, listed there)
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GENERATE_ENDPOINTS,
    MESSAGES,
    RERANK,
    RESPONSES,
    SCORE,
)


@dataclass(frozen=True, slots=True)
class StepCost:
    """How an engine's decode step costs with ``n`` lines in it, up to a scale: ``fixed +
    per_line * n``. The worker learns the scale from the lines it ran and tells each batch's
    progress with it (``line_progress.py``)."""

    fixed: float
    per_line: float

    def __call__(self, lines: float) -> float:
        return self.fixed + self.per_line * lines


CPU_STEPS = StepCost(0.0, 1.0)
"""A CPU's: a step costs about in proportion to its lines (a line alone runs about as fast as all
of them together)."""
GPU_STEPS = StepCost(PROFILE.step_base_s, PROFILE.per_sequence_s)
"""A GPU's: reading the weights costs the same for one line as for dozens; each line adds its KV
cache's reads (the simulated GPU's curve, fitted to a published one: ``sim_gpu.py``)."""
LINE_TIMES = StepCost(1.0, 0.0)
"""An engine on which each line takes its own time whatever runs beside it (the fake engine)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An engine's answer: the status, the response body as raw JSON bytes, and its usage.

    The body is serialised once, by the engine, and carried as bytes to the result message and
    the output file: nothing on the way parses it again.
    """

    status: int
    body: bytes
    usage: TokenUsage | None = None

    @property
    def ok(self) -> bool:
        return self.status == HTTPStatus.OK

    @property
    def transient(self) -> bool:
        """A failure that may pass (overloaded, restarting, internal error): worth a retry."""
        return self.status >= HTTPStatus.INTERNAL_SERVER_ERROR

    def json(self) -> Any:
        """The body parsed (for tests and logs; the hot path never needs it)."""
        return orjson.loads(self.body)

    @classmethod
    def of(cls, status: int, body: Any, usage: TokenUsage | None = None) -> Answer:
        """An answer from a body given as Python data (serialised here, once)."""
        return cls(int(status), orjson.dumps(body), usage)


class EngineUnavailable(RuntimeError):
    """The engine itself died: a request's failure is not its answer. The worker stops, and the
    line, neither published nor committed, is redone by the next owner."""


class RequestAborted(Exception):
    """``run`` of a request stopped by ``abort(request_id)``: it has no answer."""


@runtime_checkable
class Engine(Protocol):
    """One model on one engine; many ``run`` calls may be in flight at once."""

    model_id: str
    max_context_length: int
    endpoints: tuple[str, ...]
    adapters: tuple[str, ...]
    """LoRA adapters served beside the model: a body whose ``model`` names one runs with it."""
    max_running: int
    """Requests the engine runs at once (vLLM's ``max_num_seqs``); the rest wait in its queue.
    0: no such limit (every request runs at once)."""
    queues: bool
    """Whether lines given beyond ``max_running`` wait inside it (vLLM's queue); False: it runs
    every line it is given at once."""
    step_cost: StepCost
    """How its steps cost with the lines in them (``CPU_STEPS``, ``GPU_STEPS``, ...)."""

    async def run(
        self,
        url: str,
        body: dict[str, Any],
        request_id: str,
        *,
        max_context_length: int | None = None,
        priority: int = 0,
    ) -> Answer:
        """Run one request; ``max_context_length`` caps prompt + output tokens for it.

        ``priority`` orders the engine's own queue when it is full: lower runs first, ties in
        arrival order (vLLM's priority scheduling); an engine without a queue ignores it.

        Raises ``RequestAborted`` when ``abort(request_id)`` stops it and ``CancelledError``
        when the awaiting task is cancelled (the cancellation rule above); ``EngineUnavailable``
        when the engine died. Any other outcome is an ``Answer``.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running request (no-op when it is unknown or finished)."""
        ...


@runtime_checkable
class ReportsReadiness(Protocol):
    """An engine with readiness checks of its own (the remote engine: its server answers); the
    worker's ``/readyz`` adds them to its own."""

    def checks(self) -> dict[str, bool]: ...


def step_cost(settings: InferenceSettings, default: StepCost) -> StepCost:
    """The engine's step cost as ``settings.step_cost`` says; ``default`` for ``auto``."""
    return {"cpu": CPU_STEPS, "gpu": GPU_STEPS}.get(settings.step_cost, default)


def error_body(
    message: str,
    status: int = HTTPStatus.BAD_REQUEST,
    *,
    err_type: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """The error envelope in vLLM's shape: ``code`` carries the HTTP status, as vLLM's does."""
    return {
        "error": {
            "message": message,
            "type": err_type or _default_type(status),
            "param": param,
            "code": int(status),
        }
    }


def error_answer(message: str, status: int = HTTPStatus.BAD_REQUEST, **kw: Any) -> Answer:
    return Answer.of(status, error_body(message, status, **kw))


def unsupported_endpoint(url: str, endpoints: tuple[str, ...]) -> Answer:
    return error_answer(
        f"The model does not support {url}; supported: {', '.join(endpoints)}",
        HTTPStatus.NOT_FOUND,
        param="url",
    )


def refuse_before_running(url: str, body: dict[str, Any], endpoints: tuple[str, ...]) -> Answer | None:
    """The refusals every engine makes before running anything: unknown endpoint, streaming, and
    a Responses request that needs a store of responses (a batch line keeps none)."""
    if url not in endpoints:
        return unsupported_endpoint(url, endpoints)
    if body.get("stream"):
        return error_answer("Request must not be sent in stream mode", param="stream")
    if url == RESPONSES:
        for field in RESPONSES_NEEDING_A_STORE:
            if body.get(field):
                return error_answer(f"{field} is not supported in a batch", param=field)
    return None


RESPONSES_NEEDING_A_STORE = ("background", "previous_response_id")
"""Responses fields a batch line cannot honour: the engine stores no response, so a line can
neither run in the background (to be fetched later) nor continue a stored response."""


def _default_type(status: int) -> str:
    if status == HTTPStatus.NOT_FOUND:
        return "NotFoundError"
    if status >= 500:
        return "InternalServerError"
    return "BadRequestError"


# ------------------------------------------------------------------- the cancellation rule, enforced
# An engine runs each request through ``RunRegistry.run``: the request becomes a task it can
# abort, and whatever the work returns after an abort or a cancellation is thrown away. vLLM's
# serving code catches a cancellation and returns a "client disconnected" error body instead of
# raising, so without this a stopped request would come back as a failed line.


class RunRegistry:
    """The requests an engine is running, by request id."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[Answer]] = {}
        self._aborted: set[str] = set()

    def __len__(self) -> int:
        return len(self._running)

    async def run(self, request_id: str, work: Coroutine[Any, Any, Answer]) -> Answer:
        """``work``'s answer, or ``RequestAborted`` / ``CancelledError`` if it was stopped."""
        task = asyncio.ensure_future(work)
        self._running[request_id] = task
        try:
            answer = await task
        except asyncio.CancelledError:
            if self._take_aborted(request_id) and not _cancelling():
                raise RequestAborted(request_id) from None
            raise
        finally:
            self._running.pop(request_id, None)
        aborted = self._take_aborted(request_id)
        if _cancelling():
            raise asyncio.CancelledError(f"request {request_id} cancelled")
        if aborted:
            raise RequestAborted(request_id)
        return answer

    def abort(self, request_id: str) -> None:
        """Stop a running request; no-op when it is unknown or finished."""
        task = self._running.get(request_id)
        if task is not None and not task.done():  # a finished request keeps its answer
            self._aborted.add(request_id)
            task.cancel()

    def _take_aborted(self, request_id: str) -> bool:
        if request_id in self._aborted:
            self._aborted.discard(request_id)
            return True
        return False

    def cancel_all(self) -> None:
        """Stop every running request (engine shutdown): each ``run`` raises CancelledError."""
        for task in list(self._running.values()):
            task.cancel()


def _cancelling() -> bool:
    """Whether the current task was asked to cancel (even if an awaited task swallowed it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
