"""batchstream's read-only views beside the OpenAI endpoints: a batch's progress over time, its
error lines searched and paged, and a project's usage per model and day. The web console reads
these; so may any client (docs/api.md, "Extensions")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from services.api.deps import ErrorLines, Overview, Project
from services.api.openapi import errors
from services.api.page_sizes import ERROR_LINES_PAGE, ERROR_LINES_PAGE_MAX
from services.api.service.overview import USAGE_DAYS_DEFAULT, USAGE_DAYS_MAX
from shared.protocol.extensions import BatchProgress, ErrorLinesPage
from shared.protocol.openai import ListObject

router = APIRouter(tags=["batchstream extensions"])


@router.get("/v1/batches/{batch_id}/progress", response_model=BatchProgress, responses=errors(404))
async def batch_progress(project: Project, overview: Overview, batch_id: str) -> BatchProgress:
    """Completed and failed lines over time, sampled with the live counts (the newest samples kept)."""
    return await overview.progress(project, batch_id)


@router.get("/v1/batches/{batch_id}/error_lines", response_model=ErrorLinesPage, responses=errors(404))
async def batch_error_lines(
    project: Project,
    error_lines: ErrorLines,
    batch_id: str,
    custom_id: Annotated[str | None, Query(description="Only lines whose custom_id contains this.")] = None,
    code: Annotated[str | None, Query(description="Only lines with this error code or HTTP status.")] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=ERROR_LINES_PAGE_MAX)] = ERROR_LINES_PAGE,
) -> ErrorLinesPage:
    """The batch's error lines so far (or its error file once it ended), with their codes."""
    return await error_lines.page(
        project, batch_id, offset=offset, limit=limit, custom_id=custom_id, code=code
    )


@router.get("/v1/usage", response_model=ListObject)
async def usage(
    project: Project,
    overview: Overview,
    days: Annotated[int, Query(ge=1, le=USAGE_DAYS_MAX)] = USAGE_DAYS_DEFAULT,
) -> ListObject:
    """The project's lines and tokens per model and UTC day of the batches' creation, newest first."""
    return ListObject(data=await overview.usage(project, days))
