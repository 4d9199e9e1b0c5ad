"""Body limits hold while the body streams: a body over its limit is refused with 413 in OpenAI's
shape, by its Content-Length or as its bytes arrive, and the route never reads it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import pytest
from fastapi import FastAPI, File, Form, Request, UploadFile

from services.api.body_limit import MULTIPART_SLACK, BodyLimit
from services.api.errors import install_error_handlers
from shared.settings import ApiSettings

LIMITS = ApiSettings(
    max_file_bytes=1000, max_batch_input_bytes=100_000, max_json_body_bytes=200, max_message_batch_bytes=5000
)


def app_with_limits(reached: list[str]) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/files")
    async def upload(file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]) -> dict[str, Any]:
        reached.append("upload")
        return {"bytes": file.size}

    @app.post("/v1/batches")
    async def create(request: Request) -> dict[str, Any]:
        body = await request.body()
        reached.append("create")
        return {"bytes": len(body)}

    @app.post("/v1/messages/batches")
    async def create_message_batch(request: Request) -> dict[str, Any]:
        body = await request.body()
        reached.append("message batch")
        return {"bytes": len(body)}

    app.add_middleware(BodyLimit, settings=LIMITS)
    return app


@pytest.fixture
def reached() -> list[str]:
    return []


@pytest.fixture
async def client(reached: list[str]) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app_with_limits(reached))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c


def assert_413(response: httpx.Response, code: str, limit: int) -> None:
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert str(limit) in error["message"]


async def chunked(data: bytes, piece: int = 1000) -> AsyncIterator[bytes]:
    for at in range(0, len(data), piece):
        yield data[at : at + piece]


OVER = 100_000 + MULTIPART_SLACK + 1  # over the largest upload with any framing


async def test_an_upload_within_the_largest_file_limit_reaches_the_route(
    client: httpx.AsyncClient, reached: list[str]
) -> None:
    response = await client.post(
        "/v1/files", files={"file": ("a.jsonl", b"y" * 4000)}, data={"purpose": "batch"}
    )
    assert response.status_code == 200, response.text
    assert reached == ["upload"]


async def test_an_upload_over_the_limit_by_its_content_length_is_refused_unread(
    client: httpx.AsyncClient, reached: list[str]
) -> None:
    response = await client.post(
        "/v1/files", files={"file": ("a.jsonl", b"y" * OVER)}, data={"purpose": "batch"}
    )
    assert_413(response, "file_too_large", 100_000)
    assert response.json()["error"]["param"] == "file"
    assert reached == []


async def test_a_chunked_upload_is_refused_once_its_bytes_pass_the_limit(
    client: httpx.AsyncClient, reached: list[str]
) -> None:
    form = client.build_request(
        "POST", "/v1/files", files={"file": ("a.jsonl", b"y" * OVER)}, data={"purpose": "batch"}
    )
    headers = {"content-type": form.headers["content-type"]}  # and no content-length: chunked
    response = await client.post("/v1/files", content=chunked(form.read()), headers=headers)
    assert_413(response, "file_too_large", 100_000)
    assert reached == []


@pytest.mark.parametrize(("purpose", "status"), [("user_data", 413), ("batch", 200)])
async def test_once_its_purpose_is_read_an_upload_is_held_to_that_purposes_limit(
    client: httpx.AsyncClient, reached: list[str], purpose: str, status: int
) -> None:
    size = 1000 + MULTIPART_SLACK + 10  # over the user_data limit with any framing, under batch's
    form = client.build_request(
        "POST", "/v1/files", files={"file": ("a.jsonl", b"y" * size)}, data={"purpose": purpose}
    )
    headers = {"content-type": form.headers["content-type"]}
    response = await client.post("/v1/files", content=chunked(form.read()), headers=headers)
    assert response.status_code == status, response.text
    if status == 413:
        assert_413(response, "file_too_large", 1000)
        assert "purpose 'user_data'" in response.json()["error"]["message"]
    assert reached == ([] if status == 413 else ["upload"])


async def test_a_form_the_limit_cannot_read_is_left_to_the_route(client: httpx.AsyncClient) -> None:
    headers = {"content-type": "multipart/form-data; boundary=" + "b" * 8000}
    response = await client.post("/v1/files", content=b"x", headers=headers)
    assert response.status_code == 400, response.text


async def test_a_json_body_over_its_limit_is_refused_by_length_or_as_it_streams(
    client: httpx.AsyncClient, reached: list[str]
) -> None:
    assert (await client.post("/v1/batches", content=b"z" * 200)).status_code == 200
    assert_413(await client.post("/v1/batches", content=b"z" * 201), "request_too_large", 200)
    assert_413(await client.post("/v1/batches", content=chunked(b"z" * 300, 100)), "request_too_large", 200)
    assert reached == ["create"]


async def test_a_message_batch_body_has_its_own_limit(client: httpx.AsyncClient, reached: list[str]) -> None:
    """Its requests come inline: more than any other JSON body, up to max_message_batch_bytes."""
    within = await client.post("/v1/messages/batches", content=b"x" * 5000)
    assert within.status_code == 200 and reached == ["message batch"]
    assert_413(await client.post("/v1/messages/batches", content=b"x" * 5001), "request_too_large", 5000)
    streamed = await client.post("/v1/messages/batches", content=chunked(b"x" * 6000))
    assert_413(streamed, "request_too_large", 5000)
    assert reached == ["message batch"]
