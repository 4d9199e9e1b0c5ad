"""The OpenAPI document says what the api really answers.

FastAPI infers the success bodies, but left alone it documents a 422 ``HTTPValidationError`` the
api never sends (``errors.py`` turns validation errors into a 400 in OpenAI's shape) and none of
the errors it does send. This module declares them: every operation's error statuses with the one
error body, ``Retry-After`` on a 503, and the media types of the streamed downloads (the bearer
scheme comes from ``deps.py``'s ``HTTPBearer``). The fuzz test (tests/integration/api/test_fuzz.py)
holds every response to it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx body: OpenAI's error envelope."""

    error: ErrorDetail


class HealthStatus(BaseModel):
    status: str
    unavailable: list[str] | None = None


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: these statuses answer with the error body."""
    return {status: {"model": ErrorResponse, "description": _DESCRIPTIONS[status]} for status in statuses}


def streamed(media_type: str, description: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route that streams bytes of ``media_type`` instead of JSON."""
    return {200: {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}}


_DESCRIPTIONS = {
    400: "The request is malformed or a parameter is invalid.",
    401: "The API key is missing or wrong.",
    404: "No such object in this project.",
    409: "The object's state does not allow this.",
    413: "The request body (an upload: the file) is over its size limit.",
    429: "The project is at one of its quotas (the error's type names it); retry after Retry-After seconds.",
    500: "An unexpected server error.",
    503: "A dependency (MongoDB, object storage, Kafka) is unavailable; retry after Retry-After seconds.",
}

# Statuses any operation may answer; the routes declare their own (404, 409, 413) with errors().
_EVERYWHERE = (400, 500, 503)
_UNAUTHENTICATED = {"/health", "/livez", "/readyz", "/metrics"}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "string"}}}


def install_openapi(app: FastAPI) -> None:
    """Replace ``app.openapi`` with the generator of the corrected document (built once)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _corrected(
                get_openapi(title=app.title, version=app.version, routes=app.routes)
            )
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]


def _corrected(doc: dict[str, Any]) -> dict[str, Any]:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in (ErrorResponse, HealthStatus):
        defs = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(defs.pop("$defs", {}))
        schemas[model.__name__] = defs
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for path, operations in doc["paths"].items():
        for operation in operations.values():
            responses = operation["responses"]
            responses.pop("422", None)
            success = responses.get("200", {}).get("content", {})
            if len(success) > 1:  # a streamed() route: FastAPI adds a JSON body it never sends
                success.pop("application/json", None)
            statuses = _EVERYWHERE if path in _UNAUTHENTICATED else (*_EVERYWHERE, 401)
            if "requestBody" in operation:  # every body has a size limit (body_limit.py)
                statuses = (*statuses, 413)
            for status in statuses:
                responses.setdefault(str(status), {"description": _DESCRIPTIONS[status], "content": error})
            responses["503"]["headers"] = _RETRY_AFTER
            if "429" in responses:
                responses["429"]["headers"] = _RETRY_AFTER
    health = doc["paths"]["/health"]["get"]["responses"]
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/HealthStatus"}}}
    health["200"]["content"] = body
    health["503"] = {"description": "A dependency is down.", "content": body, "headers": _RETRY_AFTER}
    return doc
