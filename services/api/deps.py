"""The api's services as one typed object on ``app.state``, and the dependency aliases that hand
them to routes, so route signatures read as plain types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from aiokafka import AIOKafkaProducer
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.api.quotas.service import QuotaService
from services.api.service.batches import BatchService
from services.api.service.error_lines import ErrorLinesService
from services.api.service.files import FileService
from services.api.service.keys import KeyRing
from services.api.service.message_batches import MessageBatchService
from services.api.service.overview import OverviewService
from services.api.service.partial import PartialOutputService
from services.api.service.retry import RetryService
from shared.errors import AuthenticationFailed
from shared.mongo import Mongo
from shared.storage import ObjectStore
from shared.stores.models import ModelStore


@dataclass(frozen=True)
class ApiServices:
    """What the routes reach, built once in the app's lifespan (``app.py``): ``app.state.services``."""

    mongo: Mongo
    store: ObjectStore
    producer: AIOKafkaProducer
    keys: KeyRing
    models: ModelStore
    quotas: QuotaService
    files: FileService
    batches: BatchService
    partial: PartialOutputService
    error_lines: ErrorLinesService
    overview: OverviewService
    retry: RetryService
    message_batches: MessageBatchService


def services(request: Request) -> ApiServices:
    return request.app.state.services  # type: ignore[no-any-return]


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
    project = await services(request).keys.project_for(key)
    if project is None:
        raise AuthenticationFailed("Incorrect API key provided.")
    return str(project)


def _files(request: Request) -> FileService:
    return services(request).files


def _batches(request: Request) -> BatchService:
    return services(request).batches


def _error_lines(request: Request) -> ErrorLinesService:
    return services(request).error_lines


def _overview(request: Request) -> OverviewService:
    return services(request).overview


def _retry(request: Request) -> RetryService:
    return services(request).retry


def _quotas(request: Request) -> QuotaService:
    return services(request).quotas


Project = Annotated[str, Depends(_project)]
Files = Annotated[FileService, Depends(_files)]
Batches = Annotated[BatchService, Depends(_batches)]
ErrorLines = Annotated[ErrorLinesService, Depends(_error_lines)]
Overview = Annotated[OverviewService, Depends(_overview)]
Retry = Annotated[RetryService, Depends(_retry)]
Quotas = Annotated[QuotaService, Depends(_quotas)]
