"""A batch's error lines, paged and searched by custom_id and error code (the console's view).

Reads the same stream as ``partial_output?kind=error`` (the result chunks while the batch runs,
the error file once it ended) one line at a time and keeps only the page asked for: memory does
not grow with the error file. A page further on reads the lines before it again; the first page,
the one a person opens, reads only as far as it shows (while the batch runs, the results stored so
far are read from the first, output lines included, until the page is full).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pydantic_core import to_json

from services.api.service.partial import PartialOutputService
from shared.errors import echo
from shared.input_lines import is_request, split_lines
from shared.protocol.extensions import ErrorLine, ErrorLinesPage
from shared.settings import ApiSettings

UNREADABLE = "unreadable_line"
"""The code shown for an error-file line that is not a JSON object."""


def describe(position: int, raw: bytes) -> ErrorLine:
    """An error-file line with the code and message it is shown and searched by.

    A line that never ran has ``error: {code, message}``; one the engine refused has the engine's
    envelope in ``response.body.error`` (vLLM: ``type`` is the name, ``code`` the HTTP status).
    """
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):  # not what finalize writes; shown, not a 500
        text = raw.decode("utf-8", "replace")
        return ErrorLine(
            line=position, custom_id="", code=UNREADABLE, message=echo(text, quote=False), raw={"line": text}
        )
    error: dict[str, Any] = doc["error"] if isinstance(doc.get("error"), dict) else {}
    response: dict[str, Any] = doc["response"] if isinstance(doc.get("response"), dict) else {}
    body = response.get("body")
    engine_error: dict[str, Any] = {}
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        engine_error = body["error"]
    status = response.get("status_code")
    code = error.get("code") or engine_error.get("type") or engine_error.get("code") or status or "error"
    message = error.get("message") or engine_error.get("message") or ""
    return ErrorLine(
        line=position,
        custom_id=str(doc.get("custom_id", "")),
        code=str(code),
        message=str(message),
        status_code=status if isinstance(status, int) else None,
        raw=doc,
    )


def matches(line: ErrorLine, custom_id: str | None, code: str | None) -> bool:
    if custom_id and custom_id not in line.custom_id:
        return False
    if code:
        wanted = code.strip().lower()
        candidates = {line.code.lower(), str(line.status_code or "").lower()}
        if wanted not in candidates:
            return False
    return True


async def error_lines(stream: AsyncIterator[bytes]) -> AsyncGenerator[ErrorLine]:
    """Each line of an error stream, described, numbered from 1 (blank lines skipped)."""
    position = 0
    async for raw in split_lines(stream):
        if is_request(raw):
            position += 1
            yield describe(position, raw)


class ErrorLinesService:
    def __init__(
        self,
        partial: PartialOutputService,
        max_bytes: int = ApiSettings.model_fields["max_list_bytes"].default,
    ) -> None:
        self.partial = partial
        self.max_bytes = max_bytes  # of a page's lines, as JSON (``max_list_bytes``)

    async def page(
        self,
        project: str,
        batch_id: str,
        *,
        offset: int,
        limit: int,
        custom_id: str | None = None,
        code: str | None = None,
    ) -> ErrorLinesPage:
        stream = await self.partial.open(project, batch_id, "error")  # 404 before anything is read
        found: list[ErrorLine] = []
        matched = used = 0
        has_more = False
        try:
            async for line in error_lines(stream):
                if not matches(line, custom_id, code):
                    continue
                matched += 1
                if matched <= offset:
                    continue
                used += len(to_json(line)) + 1
                if len(found) == limit or (found and used > self.max_bytes):
                    has_more = True
                    break
                found.append(line)
        finally:
            await stream.aclose()
        next_offset = offset + len(found) if has_more else None
        return ErrorLinesPage(data=found, has_more=has_more, next_offset=next_offset)
