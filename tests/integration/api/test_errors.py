"""Every error a client can provoke comes back in OpenAI's shape with the right status; none is a 500."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from deploy.local import Stack, free_port
from tests.support.http_batches import assert_error, create, upload
from tests.support.lines import chat_request, jsonl
from tests.support.private_servers import PrivateMongo
from tests.support.stacks import extra_api
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def test_a_missing_key_is_401(stack: Stack) -> None:
    assert_error(httpx.get(f"{stack.base_url}/files"), 401, "invalid_api_key")


def test_a_wrong_key_is_401_through_the_sdk(stack: Stack) -> None:
    bad = OpenAI(base_url=stack.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.files.list()


@pytest.mark.parametrize(
    "path", ["/files/file-nope", "/files/file-nope/content", "/batches/batch_nope", "/models/nope"]
)
def test_unknown_ids_are_404(http: httpx.Client, path: str) -> None:
    assert_error(http.get(path), 404)


def test_an_unknown_route_is_404_json(http: httpx.Client) -> None:
    assert_error(http.get("/nothing-here"), 404)


def test_metrics_are_on_their_own_port_not_the_apis(stack: Stack) -> None:
    """The series name projects and their queues: nobody who reaches the api lists them."""
    public = httpx.get(stack.base_url.removesuffix("/v1") + "/metrics", timeout=5)
    assert public.status_code == 404
    scraped = httpx.get(f"http://127.0.0.1:{stack.ports.api_metrics}/metrics", timeout=5)
    assert scraped.status_code == 200 and "batchstream_api_requests_total" in scraped.text


def test_an_unknown_input_file_is_404_at_create(http: httpx.Client) -> None:
    assert_error(create(http, prefix="", input_file_id="file-nope"), 404, param="file_id")


def test_a_bad_endpoint_is_400_invalid_value(http: httpx.Client, model_id: str) -> None:
    file = upload(http, jsonl([chat_request("a", model_id)]), prefix="")
    assert_error(
        create(http, prefix="", input_file_id=file["id"], endpoint="/v1/nope"),
        400,
        "invalid_value",
        "endpoint",
    )


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        ({f"k{i}": "v" for i in range(17)}, "invalid_value"),
        ({"k" * 65: "v"}, "invalid_value"),
        ({"k": "v" * 513}, "invalid_value"),
        ({"k": 1}, "invalid_type"),
        (["not", "an", "object"], "invalid_type"),
    ],
)
def test_bad_metadata_is_400(http: httpx.Client, model_id: str, metadata: Any, code: str) -> None:
    file = upload(http, jsonl([chat_request("a", model_id)]), prefix="")
    assert_error(create(http, prefix="", input_file_id=file["id"], metadata=metadata), 400, code, "metadata")


def test_an_unsupported_completion_window_is_400(http: httpx.Client, model_id: str) -> None:
    file = upload(http, jsonl([chat_request("a", model_id)]), prefix="")
    response = create(http, prefix="", input_file_id=file["id"], completion_window="1h")
    assert_error(response, 400, "invalid_value", "completion_window")


def test_a_file_of_the_wrong_purpose_is_400_at_create(http: httpx.Client, model_id: str) -> None:
    file = upload(http, jsonl([chat_request("a", model_id)]), purpose="user_data", prefix="")
    assert_error(create(http, prefix="", input_file_id=file["id"]), 400, "invalid_value", "input_file_id")


def test_a_batch_input_that_is_not_jsonl_is_400(http: httpx.Client) -> None:
    response = http.post("/files", files={"file": ("in.csv", b"a,b\n")}, data={"purpose": "batch"})
    assert_error(response, 400, "invalid_file_format", "file")


def test_an_unknown_purpose_is_400(http: httpx.Client) -> None:
    response = http.post("/files", files={"file": ("x.jsonl", b"{}")}, data={"purpose": "nonsense"})
    assert_error(response, 400, "invalid_value", "purpose")


@pytest.mark.parametrize("seconds", ["10", "2592001"])
def test_an_expiry_out_of_range_is_400(http: httpx.Client, seconds: str) -> None:
    response = http.post(
        "/files",
        files={"file": ("x.jsonl", b"{}")},
        data={"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": seconds},
    )
    assert_error(response, 400, "invalid_value", "expires_after[seconds]")


def test_a_missing_file_field_is_400(http: httpx.Client) -> None:
    assert_error(http.post("/files", data={"purpose": "batch"}), 400, "missing_required_parameter", "file")


def test_a_file_over_the_limit_is_413(stack: Stack) -> None:
    with extra_api(stack, BATCHSTREAM_API_MAX_BATCH_INPUT_BYTES="1000") as base:
        response = httpx.post(
            f"{base}/v1/files",
            headers={"Authorization": f"Bearer {stack.api_key}"},
            files={"file": ("big.jsonl", b"x" * 2000)},
            data={"purpose": "batch"},
        )
    assert_error(response, 413, "file_too_large", "file")


def test_cancelling_a_terminal_batch_is_409(http: httpx.Client) -> None:
    file = upload(http, b"not json\n", prefix="")
    batch = create(http, prefix="", input_file_id=file["id"]).json()
    wait_until(lambda: http.get(f"/batches/{batch['id']}").json()["status"] == "failed", what="failed")
    assert_error(http.post(f"/batches/{batch['id']}/cancel"), 409)


def test_cancelling_an_unknown_batch_is_404(http: httpx.Client) -> None:
    assert_error(http.post("/batches/batch_nope/cancel"), 404)


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("POST", "/batches", {"content": b"{not json", "headers": {"content-type": "application/json"}}),
        ("POST", "/batches", {"json": ["a list"]}),
        ("POST", "/batches", {"json": {"input_file_id": 5, "endpoint": None, "completion_window": []}}),
        ("POST", "/batches", {"json": {"input_file_id": "x" * 100_000, "endpoint": "/v1/chat/completions"}}),
        (
            "POST",
            "/files",
            {"content": b"\xff\xfe garbage", "headers": {"content-type": "multipart/form-data"}},
        ),
        ("POST", "/files", {"json": {"purpose": "batch"}}),
        ("GET", "/files", {"params": {"limit": "0"}}),
        ("GET", "/files", {"params": {"limit": "many", "order": "sideways"}}),
        ("GET", "/batches", {"params": {"limit": "101"}}),
        ("GET", "/batches", {"params": {"after": "batch_does_not_exist"}}),
        ("GET", "/files/%00%ff", {}),
        ("DELETE", "/batches/x", {}),
    ],
)
def test_malformed_requests_get_a_4xx_never_a_500(
    http: httpx.Client, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    response = http.request(method, path, **kwargs)
    assert 400 <= response.status_code < 500, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_dependency_down_is_503_with_retry_after(stack: Stack, tmp_path: Any) -> None:
    mongo = PrivateMongo(free_port(), tmp_path / "mongo")
    mongo.start()
    try:
        uri = f"mongodb://127.0.0.1:{mongo.port}/?directConnection=true&serverSelectionTimeoutMS=1500"
        with extra_api(stack, BATCHSTREAM_MONGO_URI=uri) as base:
            headers = {"Authorization": f"Bearer {stack.api_key}"}
            assert httpx.get(f"{base}/health").json() == {"status": "healthy"}
            mongo.stop()  # SIGKILL
            health = httpx.get(f"{base}/health", timeout=30)
            assert health.status_code == 503 and health.headers["retry-after"]
            assert "mongodb" in health.json()["unavailable"]
            assert httpx.get(f"{base}/readyz", timeout=30).status_code == 503
            assert httpx.get(f"{base}/livez", timeout=5).status_code == 200  # no restart loop
            started = time.monotonic()
            response = httpx.get(f"{base}/v1/batches/batch_x", headers=headers, timeout=30)
            assert_error(response, 503, "service_unavailable")
            assert response.headers["retry-after"]
            assert time.monotonic() - started < 20
    finally:
        mongo.stop()
