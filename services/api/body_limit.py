"""Request body limits enforced while the body streams in (an ASGI middleware).

A body over its limit is refused with 413 in OpenAI's error shape before it is read: at once when
its ``Content-Length`` says so, else as soon as the bytes received pass the limit (a chunked
body). The route never sees such a body, so a too-large upload is never spooled to disk whole.
File uploads may have the largest file size of any purpose (and room for the multipart framing);
the upload then checks its purpose's own limit. Every other call's body is JSON, a few kilobytes.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.errors import error_response
from shared.errors import PayloadTooLarge
from shared.settings import ApiSettings

UPLOAD_PATH = "/v1/files"
MULTIPART_SLACK = 64 * 1024
"""Bytes an upload's body may have beyond the file: the multipart framing and form fields."""
REQUEST_TOO_LARGE = "request_too_large"


class _BodyTooLarge(Exception):
    """The body passed its limit while it was read."""


def _refusal(scope: Scope, settings: ApiSettings) -> tuple[int, PayloadTooLarge]:
    """The body limit of a request, and the error a body over it gets."""
    if scope["method"] == "POST" and scope["path"].rstrip("/") == UPLOAD_PATH:
        largest = max(settings.max_file_bytes, settings.max_batch_input_bytes)
        error = PayloadTooLarge(f"The file is over the largest upload, {largest} bytes.", param="file")
        return largest + MULTIPART_SLACK, error
    limit = settings.max_json_body_bytes
    message = f"The request body is over the limit of {limit} bytes."
    return limit, PayloadTooLarge(message, code=REQUEST_TOO_LARGE)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    def __init__(self, app: ASGIApp, settings: ApiSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, error = _refusal(scope, self.settings)
        length = _content_length(scope)
        if length is not None and length > limit:
            await error_response(error)(scope, receive, send)
            return
        received, exceeded, started = 0, False, False

        async def counted() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def unless_refused(message: Message) -> None:
            nonlocal started
            if exceeded:
                return  # the app's answer to a cut body: ours replaces it
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, unless_refused)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await error_response(error)(scope, receive, send)
