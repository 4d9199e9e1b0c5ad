"""The one place exceptions become HTTP responses, always in OpenAI's error shape."""

from __future__ import annotations

import logging

from aiokafka.errors import KafkaError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from minio.error import MinioException
from pymongo.errors import ConnectionFailure, PyMongoError, ServerSelectionTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from urllib3.exceptions import HTTPError as StorageConnectionError

from shared.errors import BatchstreamError, DependencyUnavailable, ErrorBody, QuotaExceeded, echo

log = logging.getLogger(__name__)

RETRY_AFTER_S = "2"
# How long a call waits on MongoDB, object storage or Kafka before it answers 503: a dependency
# that stops answering must not hang clients (tests/integration/test_outages.py).
DEPENDENCY_TIMEOUT_S = 8.0


def error_response(error: BatchstreamError) -> JSONResponse:
    headers = {"retry-after": RETRY_AFTER_S} if error.status_code == 503 else None
    if isinstance(error, QuotaExceeded):
        headers = {"retry-after": str(error.retry_after_s)}
    return JSONResponse(error.body().to_json(), status_code=error.status_code, headers=headers)


UNKNOWN_PARAMETER = "unknown_parameter"
DATABASE_UNAVAILABLE = "The database is unavailable; retry shortly."
SERVER_ERROR = "The server had an error processing the request."


def _param(loc: tuple[str | int, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return echo(".".join(parts), quote=False) if parts else None


def _unknown(names: list[str]) -> ErrorBody:
    """OpenAI's answer to body fields it does not take, naming them (the first as ``param``)."""
    plural = "s" if len(names) > 1 else ""
    listed = echo(", ".join(names), quote=False)
    message = f"Unrecognized request argument{plural} supplied: {listed}"
    return ErrorBody.of(message, "invalid_request_error", names[0], UNKNOWN_PARAMETER)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(BatchstreamError)
    async def _known(_: Request, exc: BatchstreamError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        extra = [_param(tuple(e["loc"])) for e in exc.errors() if e.get("type") == "extra_forbidden"]
        unknown = [name for name in extra if name]
        if unknown:  # named before any other error, as OpenAI does
            return JSONResponse(_unknown(unknown).to_json(), status_code=400)
        first = exc.errors()[0] if exc.errors() else {}
        param = _param(tuple(first.get("loc", ())))
        message = f"{first.get('msg', 'Invalid request')}" + (f" ({param})" if param else "")
        code = "invalid_value" if first.get("type") != "missing" else "missing_required_parameter"
        body = ErrorBody.of(message, "invalid_request_error", param, code)
        return JSONResponse(body.to_json(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        body = ErrorBody.of(str(exc.detail), "invalid_request_error", None, code)
        return JSONResponse(body.to_json(), status_code=exc.status_code)

    @app.exception_handler(ConnectionFailure)
    @app.exception_handler(ServerSelectionTimeoutError)
    async def _mongo_down(_: Request, exc: Exception) -> JSONResponse:
        log.warning("mongodb unavailable: %s", exc)
        return error_response(DependencyUnavailable(DATABASE_UNAVAILABLE))

    @app.exception_handler(PyMongoError)
    async def _mongo_error(request: Request, exc: PyMongoError) -> JSONResponse:
        if exc.timeout:  # the operation's time limit (timeoutMS) passed: MongoDB is not answering
            return await _mongo_down(request, exc)
        log.exception("database error")
        return error_response(BatchstreamError(SERVER_ERROR))

    # S3Error (an error answer), the SDK's other errors, and urllib3's (no answer: refused, timed out)
    @app.exception_handler(MinioException)
    @app.exception_handler(StorageConnectionError)
    async def _storage(_: Request, exc: Exception) -> JSONResponse:
        log.warning("object storage error: %s", exc)
        return error_response(DependencyUnavailable("Object storage is unavailable; retry shortly."))

    @app.exception_handler(TimeoutError)  # a call bounded by DEPENDENCY_TIMEOUT_S ran out of time
    async def _timed_out(_: Request, exc: TimeoutError) -> JSONResponse:
        log.warning("a dependency did not answer in time: %r", exc)
        return error_response(DependencyUnavailable("A dependency did not answer in time; retry shortly."))

    @app.exception_handler(KafkaError)
    async def _kafka_down(_: Request, exc: KafkaError) -> JSONResponse:
        log.warning("kafka unavailable: %s", exc)
        return error_response(DependencyUnavailable("Kafka is unavailable; retry shortly."))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(BatchstreamError(SERVER_ERROR))
