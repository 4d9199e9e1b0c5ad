"""One root error; each subclass carries the OpenAI error ``type`` and the HTTP status it maps to.

:class:`ErrorBody` is the one shape of every error body batchstream sends (OpenAI's).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail

    @classmethod
    def of(cls, message: str, type: str, param: str | None = None, code: str | None = None) -> ErrorBody:
        return cls(error=ErrorDetail(message=message, type=type, param=param, code=code))

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


ECHO_CHARS = 200
"""Most characters of a client's value an error message quotes (``echo``)."""


def echo(value: object, *, quote: bool = True) -> str:
    """``value`` as an error message quotes it: its ``repr`` (``quote=False``: its text), cut to
    ``ECHO_CHARS`` characters and marked ``… (N characters)`` with its full length when longer.

    Every message that names a client's value (a custom_id, url, model, id, status) goes through
    here, so a 15 KB model name in 1,000 lines cannot make a batch object of 15 MB.
    """
    text = repr(value) if quote else str(value)
    if len(text) <= ECHO_CHARS:
        return text
    size = len(value) if isinstance(value, str) else len(text)
    return f"{text[:ECHO_CHARS]}… ({size} characters)"


class BatchstreamError(Exception):
    """Root of every error batchstream raises on purpose."""

    status_code: int = 500
    error_type: str = "server_error"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code

    def body(self) -> ErrorBody:
        return ErrorBody.of(self.message, self.error_type, self.param, self.code)


class InvalidRequest(BatchstreamError):
    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationFailed(BatchstreamError):
    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class NotFound(BatchstreamError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"

    @classmethod
    def no_such(cls, kind: str, object_id: str, param: str) -> NotFound:
        """OpenAI's answer to an unknown id (``kind``: ``File``, ``Batch``), the id cut short."""
        return cls(f"No such {kind} object: {echo(object_id, quote=False)}", param=param)


class Conflict(BatchstreamError):
    status_code = 409
    error_type = "invalid_request_error"


class PayloadTooLarge(BatchstreamError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "file_too_large"


class QuotaExceeded(BatchstreamError):
    """A project is at one of its quotas (services/api/quotas): 429, its ``type`` the limit's name
    (as OpenAI's names what is limited), ``retry_after_s`` the response's ``retry-after``."""

    status_code = 429

    def __init__(self, message: str, *, limit: str, code: str, retry_after_s: int) -> None:
        super().__init__(message, code=code)
        self.error_type = limit
        self.retry_after_s = retry_after_s


class DependencyUnavailable(BatchstreamError):
    """A backing service (Kafka, MongoDB, object storage) cannot be reached; clients retry."""

    status_code = 503
    error_type = "server_error"
    default_code = "service_unavailable"
