"""One root error; each subclass carries the OpenAI error ``type`` and the HTTP status it maps to."""

from __future__ import annotations


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

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


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


class Conflict(BatchstreamError):
    status_code = 409
    error_type = "invalid_request_error"


class PayloadTooLarge(BatchstreamError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "file_too_large"


class DependencyUnavailable(BatchstreamError):
    """A backing service (Kafka, MongoDB, object storage) cannot be reached; clients retry."""

    status_code = 503
    error_type = "server_error"
    default_code = "service_unavailable"
