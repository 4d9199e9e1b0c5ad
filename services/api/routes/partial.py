"""``GET /v1/batches/{id}/partial_output``: a batchstream extension, the results so far.

``?kind=output`` (default) streams the successful lines so far, ``?kind=error`` the failed ones,
as JSONL in the output file's line format. Include with ``app.include_router(partial.router)``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from services.api.deps import Project, services
from services.api.openapi import errors, streamed
from services.api.service.partial import Kind, PartialOutputService
from services.api.streams import opened

router = APIRouter(prefix="/v1/batches", tags=["batches"])


def _partial(request: Request) -> PartialOutputService:
    return services(request).partial


Partial = Annotated[PartialOutputService, Depends(_partial)]


@router.get(
    "/{batch_id}/partial_output",
    responses={**streamed("application/jsonl", "The result lines so far."), **errors(404)},
)
async def partial_output(
    project: Project, partial: Partial, batch_id: str, kind: Kind = "output"
) -> StreamingResponse:
    lines = await opened(await partial.open(project, batch_id, kind))
    return StreamingResponse(lines, media_type="application/jsonl")
