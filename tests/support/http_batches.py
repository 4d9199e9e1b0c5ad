"""A batch made and waited on over plain HTTP (httpx), for tests that look at the api's raw answers.

The client's base URL is the api's root (``http://host:port``, no ``/v1``) and carries the key,
unless the call says otherwise (``prefix``, ``headers``).
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.lines import CHAT
from tests.support.waiting import TERMINAL, wait_until


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


def wait_http_terminal(
    api: httpx.Client,
    batch_id: str,
    timeout_s: float,
    *,
    prefix: str = "/v1",
    headers: dict[str, str] | None = None,
    seen: list[str] | None = None,
) -> dict[str, Any]:
    """The batch's JSON once it has ended, polled every 0.2 s at ``{prefix}/batches/{id}``.

    ``seen`` (when given) gets each status the polls see that differs from its last entry."""

    def poll() -> dict[str, Any] | None:
        batch: dict[str, Any] = api.get(f"{prefix}/batches/{batch_id}", headers=headers).json()
        if seen is not None and (not seen or seen[-1] != batch["status"]):
            seen.append(batch["status"])
        return batch if batch["status"] in TERMINAL else None

    found: dict[str, Any] | None = wait_until(poll, timeout_s, f"batch {batch_id} to end", interval_s=0.2)
    assert found is not None
    return found
