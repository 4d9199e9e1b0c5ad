"""Message Batches endpoints (Anthropic's API): thin; the logic lives in
service/message_batches.py.

Anthropic's client sends its key in ``x-api-key`` (with ``anthropic-version``, accepted whatever
its value); a ``Authorization: Bearer`` key works too. Both name the same project keys as the
OpenAI side. Every error these routes answer is in Anthropic's shape (``AnthropicRoute``).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials

from services.api.deps import bearer, project_of, services
from services.api.page_sizes import MESSAGE_BATCHES_PAGE, MESSAGE_BATCHES_PAGE_MAX
from services.api.service.message_batches import MessageBatchService
from services.api.streams import opened
from shared.protocol.anthropic import (
    MESSAGE_BATCHES_PATH,
    AnthropicErrorResponse,
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchCreateParams,
    MessageBatchList,
)

PREFIX = MESSAGE_BATCHES_PATH


class AnthropicRoute(APIRoute):
    """A route whose errors are Anthropic's ``{"type": "error", "error": {"type", "message"}}``:
    the exception is answered by the app's one mapping (services/api/errors.py), then reshaped,
    keeping its status and headers (``retry-after``)."""

    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return await _anthropic_error(request, exc)

        return route


async def _anthropic_error(request: Request, exc: Exception) -> Response:
    found = next(
        (request.app.exception_handlers[t] for t in type(exc).__mro__ if t in request.app.exception_handlers),
        None,
    )
    if found is None:
        raise exc
    answer: Response = await found(request, exc)
    detail = orjson.loads(bytes(answer.body)).get("error") or {}
    body = AnthropicErrorResponse.of(answer.status_code, str(detail.get("message", "")))
    headers = {k: v for k, v in answer.headers.items() if k == "retry-after"}
    return JSONResponse(body.model_dump(), status_code=answer.status_code, headers=headers)


_api_key = APIKeyHeader(
    name="x-api-key",
    scheme_name="AnthropicApiKey",
    auto_error=False,
    description="An API key in Anthropic's header: `x-api-key: <key>`.",
)


async def _project(
    request: Request,
    api_key: Annotated[str | None, Depends(_api_key)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    key = (api_key or (credentials.credentials if credentials else "")).strip()
    return await project_of(request, key, "Missing API key: send 'x-api-key: <key>'.")


def _service(request: Request) -> MessageBatchService:
    return services(request).message_batches


def _results_base(request: Request) -> str:
    return str(request.base_url).rstrip("/") + PREFIX


Project = Annotated[str, Depends(_project)]
MessageBatches = Annotated[MessageBatchService, Depends(_service)]
ResultsBase = Annotated[str, Depends(_results_base)]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        status: {"model": AnthropicErrorResponse, "description": "Anthropic's error body."}
        for status in statuses
    }


_ALWAYS = (400, 401, 500, 503)
router = APIRouter(prefix=PREFIX, tags=["message batches"], route_class=AnthropicRoute)


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON Schema with its ``$defs`` written in place (for ``openapi_extra``)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        return [resolve(v) for v in node] if isinstance(node, list) else node

    return resolve(schema)  # type: ignore[no-any-return]


# The body is read raw and parsed off the event loop (the service), so it is declared here.
_CREATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": _inlined(MessageBatchCreateParams.model_json_schema())}},
    }
}


@router.post("", response_model=MessageBatch, responses=_errors(*_ALWAYS, 429), openapi_extra=_CREATE_BODY)
async def create_message_batch(
    project: Project, service: MessageBatches, base: ResultsBase, request: Request
) -> MessageBatch:
    async with service.admitted():  # the body is read only within the api's bound on creates
        return await service.create(project, await request.body(), base)


@router.get("", response_model=MessageBatchList, responses=_errors(*_ALWAYS, 404))
async def list_message_batches(
    project: Project,
    service: MessageBatches,
    base: ResultsBase,
    before_id: str | None = None,
    after_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MESSAGE_BATCHES_PAGE_MAX)] = MESSAGE_BATCHES_PAGE,
) -> MessageBatchList:
    return await service.list_page(project, limit, after_id, before_id, base)


@router.get("/{message_batch_id}", response_model=MessageBatch, responses=_errors(*_ALWAYS, 404))
async def retrieve_message_batch(
    project: Project, service: MessageBatches, base: ResultsBase, message_batch_id: str
) -> MessageBatch:
    return await service.get(project, message_batch_id, base)


@router.post("/{message_batch_id}/cancel", response_model=MessageBatch, responses=_errors(*_ALWAYS, 404, 409))
async def cancel_message_batch(
    project: Project, service: MessageBatches, base: ResultsBase, message_batch_id: str
) -> MessageBatch:
    return await service.cancel(project, message_batch_id, base)


@router.delete("/{message_batch_id}", response_model=DeletedMessageBatch, responses=_errors(*_ALWAYS, 404))
async def delete_message_batch(
    project: Project, service: MessageBatches, message_batch_id: str
) -> DeletedMessageBatch:
    return await service.delete(project, message_batch_id)


@router.get(
    "/{message_batch_id}/results",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One JSON line per request, in Anthropic's result shape.",
            "content": {"application/x-jsonl": {"schema": {"type": "string"}}},
        },
        **_errors(*_ALWAYS, 404),
    },
)
async def message_batch_results(project: Project, service: MessageBatches, message_batch_id: str) -> Response:
    chunks = await service.results(project, message_batch_id)
    return StreamingResponse(await opened(chunks), media_type="application/x-jsonl")
