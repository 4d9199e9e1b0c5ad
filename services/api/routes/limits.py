"""The calling project's quotas and its use of each: thin; the logic lives in quotas/service.py."""

from __future__ import annotations

from fastapi import APIRouter

from services.api.deps import Project, Quotas
from shared.protocol.extensions import ProjectLimitsView

router = APIRouter(tags=["batchstream extensions"])


@router.get("/v1/limits", response_model=ProjectLimitsView)
async def project_limits(project: Project, quotas: Quotas) -> ProjectLimitsView:
    """The project's limits (null: unlimited) and its use of each; queued lines and enqueued tokens
    per model (tokens estimated from the prompts' UTF-8 bytes / 4)."""
    return await quotas.view(project)
