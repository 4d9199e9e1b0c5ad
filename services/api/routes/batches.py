"""Batches endpoints: thin; the logic lives in service/batches.py."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Header, Query
from pydantic import BaseModel, ConfigDict, Field

from services.api.deps import Batches, Project, Retry
from services.api.errors import DEPENDENCY_TIMEOUT_S
from services.api.openapi import errors
from services.api.page_sizes import BATCHES_PAGE, BATCHES_PAGE_MAX
from services.api.schemas import BatchCreateParams
from shared.errors import InvalidRequest, echo
from shared.lifecycle import STATUSES
from shared.protocol.openai import Batch, ListObject

router = APIRouter(prefix="/v1/batches", tags=["batches"])


def parse_statuses(raw: str | None) -> frozenset[str] | None:
    if raw is None or not raw.strip():
        return None
    wanted = frozenset(s.strip() for s in raw.split(",") if s.strip())
    unknown = sorted(wanted - set(STATUSES))
    if unknown:
        raise InvalidRequest(
            f"Unknown status {echo(unknown[0])}; expected some of: {', '.join(STATUSES)}.", param="status"
        )
    return wanted


@router.post("", response_model=Batch, responses=errors(404, 429))
async def create_batch(
    project: Project,
    batches: Batches,
    params: BatchCreateParams,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> Batch:
    return await batches.create(project, params, idempotency_key)


@router.get("", response_model=ListObject, responses=errors(404))
async def list_batches(
    project: Project,
    batches: Batches,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=BATCHES_PAGE_MAX)] = BATCHES_PAGE,
    status: Annotated[
        str | None,
        Query(description="batchstream's extension: only batches in these statuses (comma-separated)."),
    ] = None,
) -> ListObject:
    return await batches.list_page(project, after, limit, parse_statuses(status))


@router.get("/{batch_id}", response_model=Batch, responses=errors(404))
async def retrieve_batch(project: Project, batches: Batches, batch_id: str) -> Batch:
    return await batches.get(project, batch_id)


@router.post("/{batch_id}/cancel", response_model=Batch, responses=errors(404, 409))
async def cancel_batch(project: Project, batches: Batches, batch_id: str) -> Batch:
    # Kafka down, the announcement can take two producer timeouts to fail (metadata, then
    # delivery): bound the call, a timeout is a 503 (errors.py).
    return await asyncio.wait_for(batches.cancel(project, batch_id), DEPENDENCY_TIMEOUT_S)


class RetryParams(BaseModel):
    """``POST /v1/batches/{id}/retry``: batchstream's extension (docs/api.md, "Retry")."""

    model_config = ConfigDict(extra="forbid")
    codes: list[str] | None = Field(
        default=None, description="Retry only the error lines with one of these codes (or HTTP statuses)."
    )


@router.post("/{batch_id}/retry", response_model=Batch, responses=errors(400, 404, 409, 429))
async def retry_batch(
    project: Project, retry: Retry, batch_id: str, params: RetryParams | None = None
) -> Batch:
    """A new batch of this finished batch's failed lines, its metadata naming this one in ``retry_of``."""
    return await retry.retry(project, batch_id, params.codes if params else None)
