"""The engine interface the worker runs requests through, and the OpenAI error envelope.

An engine answers like vLLM's OpenAI server would: an HTTP-like status code and the exact JSON
body (a ``chat.completion``, ``text_completion`` or embedding ``list``; or an error envelope).
It never raises for a bad request: a client mistake is a 4xx answer, so the worker goes on.

Nothing here imports vLLM: the vLLM engine lives in ``vllm_engine`` and is imported lazily by
``open_engine``, so tests and the pipeline benchmark run without it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any, Protocol, runtime_checkable

from shared.settings import InferenceSettings

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
GENERATE_ENDPOINTS = (CHAT, COMPLETIONS)

Answer = tuple[int, dict[str, Any]]


class EngineUnavailable(RuntimeError):
    """The engine itself died: a request's failure is not its answer. The worker stops, and the
    line, neither published nor committed, is redone by the next owner."""


@runtime_checkable
class Engine(Protocol):
    """One model on one engine; many ``run`` calls may be in flight at once."""

    model_id: str
    max_context_length: int
    endpoints: tuple[str, ...]

    async def run(
        self,
        url: str,
        body: dict[str, Any],
        request_id: str,
        *,
        max_context_length: int | None = None,
    ) -> Answer:
        """Run one request; ``max_context_length`` caps prompt + output tokens for it.

        Raises ``asyncio.CancelledError`` when ``abort(request_id)`` stops it.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running request (no-op when it is unknown or finished)."""
        ...


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
    return int(status), error_body(message, status, **kw)


def _default_type(status: int) -> str:
    if status == HTTPStatus.NOT_FOUND:
        return "NotFoundError"
    if status >= 500:
        return "InternalServerError"
    return "BadRequestError"


def unsupported_endpoint(url: str, endpoints: tuple[str, ...]) -> Answer:
    return error_answer(
        f"The model does not support {url}; supported: {', '.join(endpoints)}",
        HTTPStatus.NOT_FOUND,
        param="url",
    )


@asynccontextmanager
async def open_engine(settings: InferenceSettings) -> AsyncIterator[Engine]:
    """The engine ``settings.engine`` names, started and owned for the block's duration."""
    if settings.engine == "fake":
        from services.inference.fake_engine import InstantFakeEngine

        yield InstantFakeEngine(model_id=settings.model_id, max_context_length=settings.max_model_len)
        return
    if settings.engine != "vllm":
        raise ValueError(f"unknown engine {settings.engine!r} (vllm | fake)")
    from services.inference.vllm_engine import VllmEngine

    async with VllmEngine(settings) as engine:
        yield engine
