"""Models the inference workers have announced."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from services.api.deps import Project
from services.api.openapi import errors
from shared.errors import NotFound
from shared.protocol.openai import ListObject, ModelCard

router = APIRouter(prefix="/v1/models", tags=["models"])


def _card(doc: dict[str, Any]) -> ModelCard:
    return ModelCard(
        id=doc["_id"],
        created=int(doc.get("created", 0)),
        max_context_length=doc.get("max_context_length"),
    )


@router.get("", response_model=ListObject)
async def list_models(_: Project, request: Request) -> ListObject:
    docs = await request.app.state.mongo.models.find({}).sort("_id").to_list()
    return ListObject(data=[_card(d) for d in docs])


@router.get("/{model_id:path}", response_model=ModelCard, responses=errors(404))
async def retrieve_model(_: Project, request: Request, model_id: str) -> ModelCard:
    doc = await request.app.state.mongo.models.find_one({"_id": model_id})
    if doc is None:
        raise NotFound(f"The model {model_id!r} does not exist.", param="model", code="model_not_found")
    return _card(doc)
