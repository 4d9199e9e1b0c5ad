"""Files endpoints: thin; the logic lives in service/files.py."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import quote

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import StreamingResponse

from services.api.deps import Files, Project
from services.api.openapi import errors, streamed
from services.api.page_sizes import FILES_PAGE_MAX
from services.api.streams import opened
from shared.protocol.openai import FileDeleted, FileObject, ListObject

router = APIRouter(prefix="/v1/files", tags=["files"])


@router.post("", response_model=FileObject, responses=errors(413, 429))
async def upload_file(
    project: Project,
    files: Files,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
    expires_after_seconds: Annotated[int | None, Form(alias="expires_after[seconds]")] = None,
) -> FileObject:
    return await files.upload(
        project,
        file.file,
        file.size,
        file.filename or "upload",
        purpose,
        expires_after_seconds,
    )


@router.get("", response_model=ListObject, responses=errors(404))
async def list_files(
    project: Project,
    files: Files,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=FILES_PAGE_MAX)] = FILES_PAGE_MAX,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> ListObject:
    return await files.list_page(project, purpose, limit, order, after)


@router.get("/{file_id}", response_model=FileObject, responses=errors(404))
async def retrieve_file(project: Project, files: Files, file_id: str) -> FileObject:
    return await files.get(project, file_id)


@router.delete("/{file_id}", response_model=FileDeleted, responses=errors(404))
async def delete_file(project: Project, files: Files, file_id: str) -> FileDeleted:
    await files.delete(project, file_id)
    return FileDeleted(id=file_id)


@router.get(
    "/{file_id}/content",
    responses={**streamed("application/octet-stream", "The file's bytes."), **errors(404)},
)
async def file_content(project: Project, files: Files, file_id: str) -> StreamingResponse:
    doc, chunks = await files.content(project, file_id)
    headers = {"content-disposition": attachment(doc.filename)}
    return StreamingResponse(await opened(chunks), media_type="application/octet-stream", headers=headers)


def attachment(filename: str) -> str:
    """``Content-Disposition`` for a download (RFC 6266): a quoted ASCII ``filename`` (quotes,
    backslashes, control and non-ASCII characters replaced) and, when the name is not plain
    ASCII, the exact name as ``filename*=UTF-8''<percent-encoded>`` (RFC 8187)."""
    fallback = "".join(c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else "_" for c in filename)
    header = f'attachment; filename="{fallback or "download"}"'
    if fallback != filename:
        header += f"; filename*=UTF-8''{quote(filename, safe='')}"
    return header
