"""Request body limits enforced while the body streams in (an ASGI middleware).

A body over its limit is refused with 413 in OpenAI's error shape before it is read: at once when
its ``Content-Length`` says so, else as soon as the bytes received pass the limit (a chunked
body). The route never sees such a body, so a too-large upload is never spooled to disk whole.
An upload may have the largest file size of any purpose (and room for the multipart framing)
until its ``purpose`` field is read (``_FormHead``: clients send it before the file), then its
purpose's own. Every other call's body is JSON, a few kilobytes.
"""

from __future__ import annotations

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.errors import error_response
from services.api.service.files import upload_limit
from shared.errors import PayloadTooLarge
from shared.protocol.anthropic import MESSAGE_BATCHES_PATH
from shared.settings import ApiSettings

UPLOAD_PATH = "/v1/files"
MULTIPART_SLACK = 64 * 1024
"""Bytes an upload's body may have beyond the file: the multipart framing and form fields."""
REQUEST_TOO_LARGE = "request_too_large"


class _BodyTooLarge(Exception):
    """The body passed its limit while it was read."""


def _is_upload(scope: Scope) -> bool:
    return bool(scope["method"] == "POST" and scope["path"].rstrip("/") == UPLOAD_PATH)


def _refusal(scope: Scope, settings: ApiSettings) -> tuple[int, PayloadTooLarge]:
    """The body limit of a request, and the error a body over it gets."""
    if _is_upload(scope):
        largest = max(settings.max_file_bytes, settings.max_batch_input_bytes)
        error = PayloadTooLarge(f"The file is over the largest upload, {largest} bytes.", param="file")
        return largest + MULTIPART_SLACK, error
    limit = settings.max_json_body_bytes
    if scope["method"] == "POST" and scope["path"].rstrip("/") == MESSAGE_BATCHES_PATH:
        limit = settings.max_message_batch_bytes  # its requests come inline
    message = f"The request body is over the limit of {limit} bytes."
    return limit, PayloadTooLarge(message, code=REQUEST_TOO_LARGE)


def _purpose_refusal(settings: ApiSettings, purpose: str) -> tuple[int, PayloadTooLarge]:
    """An upload's limit once its purpose is known (``FileService`` checks the same one)."""
    limit = upload_limit(settings, purpose)
    message = f"The file is over {limit} bytes, the limit for purpose {purpose[:40]!r}."
    return limit + MULTIPART_SLACK, PayloadTooLarge(message, param="file")


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return bytes(value)
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class _FormHead:
    """The form fields an upload sends before its file, read as the body streams (python-multipart,
    as Starlette's own form parser): the ``purpose``. Nothing is read past the file's headers."""

    def __init__(self, boundary: bytes) -> None:
        self.purpose: str | None = None
        self.done = False  # the file part began, or the form cannot be read: nothing more to learn
        self._name = b""
        self._field, self._value = bytearray(), bytearray()
        self._is_file = False
        callbacks: dict[str, object] = {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: setattr(
                self, "_field", self._field + data[start:end]
            ),
            "on_header_value": lambda data, start, end: self._value.extend(data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }
        self._parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
        self._data = bytearray()

    @classmethod
    def of(cls, scope: Scope) -> _FormHead | None:
        content_type = _header(scope, b"content-type")
        if content_type is None:
            return None
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            return None
        try:
            return cls(boundary)
        except Exception:  # a boundary the parser refuses (too long): the route answers that
            return None

    def feed(self, chunk: bytes) -> None:
        if self.done:
            return
        try:
            self._parser.write(chunk)
        except Exception:  # not a form it can read: the route answers that
            self.done = True

    def _part_begin(self) -> None:
        self._name, self._is_file, self._data = b"", False, bytearray()

    def _header_end(self) -> None:
        if self._field.lower() == b"content-disposition":
            _, options = parse_options_header(bytes(self._value))
            self._name, self._is_file = options.get(b"name", b""), b"filename" in options
        self._field, self._value = bytearray(), bytearray()

    def _headers_finished(self) -> None:
        if self._is_file:
            self.done = True

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name == b"purpose" and len(self._data) < 64:
            self._data.extend(data[start:end])

    def _part_end(self) -> None:
        if self._name == b"purpose":
            self.purpose = self._data.decode("utf-8", "replace")


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
        form = _FormHead.of(scope) if _is_upload(scope) else None

        async def counted() -> Message:
            nonlocal received, exceeded, limit, error, form
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                received += len(chunk)
                if form is not None:
                    form.feed(chunk)
                    if form.purpose is not None:
                        limit, error = _purpose_refusal(self.settings, form.purpose)
                    if form.done:
                        form = None
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
