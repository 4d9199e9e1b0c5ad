"""Models the inference workers have announced."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from services.api.deps import Overview, Project, services
from services.api.openapi import errors
from shared.errors import NotFound, echo
from shared.protocol.openai import ListObject, ModelCard
from shared.stores.models import MODEL_NOT_FOUND

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("", response_model=ListObject)
async def list_models(
    project: Project,
    request: Request,
    overview: Overview,
    include: Annotated[
        Literal["status"] | None,
        Query(
            description="batchstream's extension: `status` adds each model's workers (alive or not) "
            "and this project's running batches and queued lines."
        ),
    ] = None,
) -> ListObject:
    if include == "status":
        return ListObject(data=await overview.models_status(project))
    return ListObject(data=await services(request).models.cards())


@router.get("/{model_id:path}", response_model=ModelCard, responses=errors(404))
async def retrieve_model(_: Project, request: Request, model_id: str) -> ModelCard:
    card = await services(request).models.card(model_id)
    if card is None:
        raise NotFound(f"The model {echo(model_id)} does not exist.", param="model", code=MODEL_NOT_FOUND)
    return card  # type: ignore[no-any-return]
