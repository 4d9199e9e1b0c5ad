"""Typed dependency aliases so route signatures read as plain types."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.api.service.batches import BatchService
from services.api.service.files import FileService
from shared.errors import AuthenticationFailed


async def _project(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.")
    project = await request.app.state.keys.project_for(key.strip())
    if project is None:
        raise AuthenticationFailed("Incorrect API key provided.")
    return str(project)


def _files(request: Request) -> FileService:
    return request.app.state.files  # type: ignore[no-any-return]


def _batches(request: Request) -> BatchService:
    return request.app.state.batches  # type: ignore[no-any-return]


Project = Annotated[str, Depends(_project)]
Files = Annotated[FileService, Depends(_files)]
Batches = Annotated[BatchService, Depends(_batches)]
