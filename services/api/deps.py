"""Typed dependency aliases so route signatures read as plain types."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.api.quotas.service import QuotaService
from services.api.service.batches import BatchService
from services.api.service.error_lines import ErrorLinesService
from services.api.service.files import FileService
from services.api.service.overview import OverviewService
from services.api.service.retry import RetryService
from shared.errors import AuthenticationFailed

# Declares the bearer scheme in the OpenAPI document, so /docs can authorize; a missing or
# malformed header is answered by _project in OpenAI's error shape, not by FastAPI's 403.
bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")


async def _project(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> str:
    key = credentials.credentials.strip() if credentials else ""
    return await project_of(request, key, "Missing API key: send 'Authorization: Bearer <key>'.")


async def project_of(request: Request, key: str, missing: str) -> str:
    """The project an API key names; 401 saying ``missing`` without a key, or for a wrong one."""
    if not key:
        raise AuthenticationFailed(missing)
    project = await request.app.state.keys.project_for(key)
    if project is None:
        raise AuthenticationFailed("Incorrect API key provided.")
    return str(project)


def _files(request: Request) -> FileService:
    return request.app.state.files  # type: ignore[no-any-return]


def _batches(request: Request) -> BatchService:
    return request.app.state.batches  # type: ignore[no-any-return]


def _error_lines(request: Request) -> ErrorLinesService:
    return request.app.state.error_lines  # type: ignore[no-any-return]


def _overview(request: Request) -> OverviewService:
    return request.app.state.overview  # type: ignore[no-any-return]


def _retry(request: Request) -> RetryService:
    return request.app.state.retry  # type: ignore[no-any-return]


def _quotas(request: Request) -> QuotaService:
    return request.app.state.quotas  # type: ignore[no-any-return]


Project = Annotated[str, Depends(_project)]
Files = Annotated[FileService, Depends(_files)]
Batches = Annotated[BatchService, Depends(_batches)]
ErrorLines = Annotated[ErrorLinesService, Depends(_error_lines)]
Overview = Annotated[OverviewService, Depends(_overview)]
Retry = Annotated[RetryService, Depends(_retry)]
Quotas = Annotated[QuotaService, Depends(_quotas)]
