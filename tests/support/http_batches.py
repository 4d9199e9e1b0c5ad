"""A batch made over plain HTTP (httpx), for tests that look at the api's raw answers.

The client's base URL is the api's root (``http://host:port``, no ``/v1``) and carries the key.
"""

from __future__ import annotations

import httpx

from tests.support.lines import CHAT


def create_batch(api: httpx.Client, content: bytes, endpoint: str = CHAT) -> str:
    """Upload ``content`` as a batch input file and create a 24 h batch on it: the batch's id.

    Both calls must answer 200 (what a batch then does is the test's to check)."""
    upload = api.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
    assert upload.status_code == 200, upload.text
    created = api.post(
        "/v1/batches",
        json={"input_file_id": upload.json()["id"], "endpoint": endpoint, "completion_window": "24h"},
    )
    assert created.status_code == 200, created.text
    return str(created.json()["id"])
