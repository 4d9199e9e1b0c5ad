"""A database error becomes OpenAI's error shape: a timed-out or unreachable MongoDB is a 503 the
client may retry, any other database error a 500 that says nothing of the server's internals."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from pymongo.errors import ExecutionTimeout, OperationFailure, ServerSelectionTimeoutError

from services.api.errors import DATABASE_UNAVAILABLE, RETRY_AFTER_S, SERVER_ERROR, install_error_handlers

RAISED = {
    "timed-out": ExecutionTimeout("operation exceeded time limit"),
    "unreachable": ServerSelectionTimeoutError("no servers"),
    "failed": OperationFailure("internal detail"),
}


async def answer(name: str) -> httpx.Response:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/v1/thing")
    async def thing() -> None:
        raise RAISED[name]

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        return await client.get("/v1/thing")


@pytest.mark.parametrize("name", ["timed-out", "unreachable"])
async def test_a_database_that_does_not_answer_is_a_503_to_retry(name: str) -> None:
    response = await answer(name)
    assert response.status_code == 503 and response.headers["retry-after"] == RETRY_AFTER_S
    assert response.json()["error"]["message"] == DATABASE_UNAVAILABLE


async def test_another_database_error_is_a_500_without_its_detail() -> None:
    response = await answer("failed")
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": SERVER_ERROR,
        "type": "server_error",
        "param": None,
        "code": None,
    }
