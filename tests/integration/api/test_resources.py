"""Files and batches behave as OpenAI's do: listing, paging, deletion, expiry, defaults, retries."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from minio import Minio
from minio.error import S3Error
from openai import OpenAI

from deploy.local.stack import Stack
from tests.support.lines import chat_request, jsonl, read_lines
from tests.support.waiting import wait_status, wait_until

pytestmark = pytest.mark.e2e


def upload(client: OpenAI, data: bytes, name: str = "in.jsonl", purpose: Any = "batch") -> str:
    return client.files.create(file=(name, data), purpose=purpose).id


def test_file_content_downloads_the_uploaded_bytes(client: OpenAI) -> None:
    data = b"".join(f'{{"n": {i}}}\n'.encode() for i in range(10_000))
    file_id = upload(client, data)
    assert client.files.retrieve(file_id).bytes == len(data)
    assert client.files.content(file_id).content == data


def test_files_list_filters_orders_and_pages(client: OpenAI) -> None:
    purpose = "user_data"
    ids = [upload(client, b"{}", name=f"{i}.jsonl", purpose=purpose) for i in range(5)]
    newest_first = [f.id for f in client.files.list(purpose=purpose).data]
    assert newest_first[:5] == ids[::-1]
    assert all(f.purpose == purpose for f in client.files.list(purpose=purpose).data)

    first = client.files.list(purpose=purpose, limit=2, order="asc")
    assert first.has_more and [f.id for f in first.data] == newest_first[::-1][:2]
    assert first.last_id == first.data[-1].id
    rest = client.files.list(purpose=purpose, limit=2, order="asc", after=first.last_id)
    assert [f.id for f in rest.data] == newest_first[::-1][2:4]
    every = [f.id for f in client.files.list(purpose=purpose, order="asc", limit=2)]  # auto-pages
    assert every == newest_first[::-1]


def test_a_deleted_file_is_gone(client: OpenAI) -> None:
    file_id = upload(client, b"{}")
    deleted = client.files.delete(file_id)
    assert (deleted.id, deleted.deleted) == (file_id, True)
    assert file_id not in [f.id for f in client.files.list().data]
    with pytest.raises(Exception, match="404"):
        client.files.retrieve(file_id)


def test_a_file_in_use_by_a_running_batch_stays_readable_by_it_until_it_ends(
    client: OpenAI, http: httpx.Client, stack: Stack, unserved_model: str, mongo_db: Any
) -> None:
    ids = ["a", "b", "c"]
    file_id = upload(client, jsonl([chat_request(i, unserved_model) for i in ids]))
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_status(client, batch.id, {"in_progress"})
    client.files.delete(file_id)
    assert http.get(f"/files/{file_id}").status_code == 404
    stored = mongo_db.files.find_one({"_id": file_id})
    assert stored is not None, "the running batch can still find its input"
    assert client.batches.retrieve(batch.id).input_file_id == file_id

    # The batch expires (no worker serves the model): its error file names every line, streamed
    # from the hidden input, and then the input's document and bytes go.
    mongo_db.batches.update_one({"_id": batch.id}, {"$set": {"expires_at": int(time.time()) - 1}})
    expired = wait_status(client, batch.id, {"expired"})
    errors = read_lines(client, expired.error_file_id)
    assert [e["custom_id"] for e in errors] == ids
    wait_until(lambda: mongo_db.files.find_one({"_id": file_id}) is None, 30, "the input's document to go")
    settings = stack.storage_settings()
    s3 = Minio(
        settings.endpoint, settings.access_key, settings.secret_key, secure=False, region=settings.region
    )
    with pytest.raises(S3Error, match=r"NoSuchKey|does not exist"):
        s3.stat_object(settings.bucket, stored["object_key"])


def test_expires_after_sets_the_file_expiry(http: httpx.Client) -> None:
    response = http.post(
        "/files",
        files={"file": ("x.jsonl", b"{}")},
        data={"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"},
    )
    body = response.json()
    assert body["expires_at"] == body["created_at"] + 3600


def test_an_expired_file_is_not_found(client: OpenAI, mongo_db: Any) -> None:
    file_id = upload(client, b"{}")
    mongo_db.files.update_one({"_id": file_id}, {"$set": {"expires_at": int(time.time()) - 1}})
    with pytest.raises(Exception, match="404"):
        client.files.retrieve(file_id)
    assert file_id not in [f.id for f in client.files.list().data]


def test_batches_list_newest_first_and_pages(client: OpenAI, unserved_model: str) -> None:
    file_id = upload(client, jsonl([chat_request("a", unserved_model)]))
    ids = [
        client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"n": str(i)},
        ).id
        for i in range(3)
    ]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    after = client.batches.list(limit=2, after=page.data[-1].id)
    assert after.data[0].id == ids[0]
    for batch_id in ids:
        client.batches.cancel(batch_id)


def test_the_batch_object_is_complete_and_echoes_defaults(client: OpenAI, unserved_model: str) -> None:
    file_id = upload(client, jsonl([chat_request("a", unserved_model)]))
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "search"},
        output_expires_after={"anchor": "created_at", "seconds": 7200},
        extra_body={"temperature": 0.0, "max_decoding_length": 16, "top_k": 5},
    )
    raw = client.batches.with_raw_response.retrieve(batch.id).http_response.json()
    for field in ("model", "errors", "usage", "request_counts", "expires_at", "cancelled_at", "metadata"):
        assert field in raw
    assert raw["expires_at"] == raw["created_at"] + 24 * 3600
    assert (raw["temperature"], raw["max_decoding_length"], raw["top_k"]) == (0.0, 16, 5)
    assert raw["top_p"] is None
    in_progress = wait_status(client, batch.id, {"in_progress"})
    assert in_progress.model == unserved_model and in_progress.in_progress_at
    assert in_progress.request_counts is not None and in_progress.request_counts.total == 1
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in {"cancelling", "cancelled"} and cancelling.cancelling_at


def test_an_idempotency_key_makes_a_retried_create_return_the_same_batch(
    http: httpx.Client, client: OpenAI, unserved_model: str
) -> None:
    file_id = upload(client, jsonl([chat_request("a", unserved_model)]))
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = http.post("/batches", json=body, headers=key).json()
    again = http.post("/batches", json=body, headers=key).json()
    assert again["id"] == first["id"]
    other = http.post("/batches", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}).json()
    assert other["id"] != first["id"]
    reused = http.post("/batches", json={**body, "metadata": {"x": "y"}}, headers=key)
    assert reused.status_code == 400 and reused.json()["error"]["code"] == "idempotency_key_reused"
    for batch_id in (first["id"], other["id"]):
        http.post(f"/batches/{batch_id}/cancel")


def test_identical_creates_from_one_key_in_a_short_window_make_one_batch(
    client: OpenAI, unserved_model: str
) -> None:
    file_id = upload(client, jsonl([chat_request("a", unserved_model)]))
    made = {
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(3)
    }
    assert len(made) == 1
    client.batches.cancel(made.pop())


@pytest.fixture(scope="module")
def owned(client: OpenAI, unserved_model: str) -> dict[str, str]:
    """A file and a batch of the default project."""
    file_id = upload(client, jsonl([chat_request("a", unserved_model)]))
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return {"file": file_id, "batch": batch.id}


class TestProjectIsolation:
    """A key never sees, downloads, deletes or cancels another project's objects: 404, not 403."""

    def test_retrieving_a_file(self, other_client: OpenAI, owned: dict[str, str]) -> None:
        with pytest.raises(Exception, match="404"):
            other_client.files.retrieve(owned["file"])

    def test_downloading_a_file(self, other_client: OpenAI, owned: dict[str, str]) -> None:
        with pytest.raises(Exception, match="404"):
            other_client.files.content(owned["file"])

    def test_deleting_a_file(self, other_client: OpenAI, client: OpenAI, owned: dict[str, str]) -> None:
        with pytest.raises(Exception, match="404"):
            other_client.files.delete(owned["file"])
        assert client.files.retrieve(owned["file"]).id == owned["file"]

    def test_listing_files(self, other_client: OpenAI, owned: dict[str, str]) -> None:
        assert owned["file"] not in [f.id for f in other_client.files.list().data]

    def test_retrieving_a_batch(self, other_client: OpenAI, owned: dict[str, str]) -> None:
        with pytest.raises(Exception, match="404"):
            other_client.batches.retrieve(owned["batch"])

    def test_cancelling_a_batch(self, other_client: OpenAI, client: OpenAI, owned: dict[str, str]) -> None:
        with pytest.raises(Exception, match="404"):
            other_client.batches.cancel(owned["batch"])
        assert client.batches.retrieve(owned["batch"]).status not in {"cancelling", "cancelled"}

    def test_listing_batches(self, other_client: OpenAI, owned: dict[str, str]) -> None:
        assert owned["batch"] not in [b.id for b in other_client.batches.list().data]

    def test_creating_a_batch_from_its_file(self, other_client: OpenAI, owned: dict[str, str]) -> None:
        with pytest.raises(Exception, match="404"):
            other_client.batches.create(
                input_file_id=owned["file"], endpoint="/v1/chat/completions", completion_window="24h"
            )

    def test_paging_after_its_ids(self, other_client: OpenAI, owned: dict[str, str]) -> None:
        with pytest.raises(Exception, match="404"):
            other_client.batches.list(after=owned["batch"])
