"""Files and batches over plain HTTP (httpx), for tests that look at the api's raw answers.

The client carries the key. Paths are ``{prefix}/files`` and ``{prefix}/batches``: ``prefix`` is
``/v1`` for a client whose base URL is the api's root (``http://host:port``) and ``""`` for one
whose base URL already ends in ``/v1``.
"""

from __future__ import annotations

from typing import Any, Final

import httpx

from tests.support.lines import CHAT
from tests.support.waiting import TERMINAL, wait_until

ANY: Final = object()
"""``assert_error``'s default ``code``: not checked."""


def upload(
    api: httpx.Client,
    data: bytes,
    name: str = "in.jsonl",
    purpose: str = "batch",
    *,
    prefix: str = "/v1",
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Upload ``data`` as a file; it must answer 200: the file object."""
    response = api.post(
        f"{prefix}/files", headers=headers, files={"file": (name, data)}, data={"purpose": purpose}
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def create(
    api: httpx.Client, *, prefix: str = "/v1", headers: dict[str, str] | None = None, **fields: Any
) -> httpx.Response:
    """``POST /batches`` with ``fields`` over a chat completions, 24 h body: the answer, unchecked."""
    body = {"endpoint": CHAT, "completion_window": "24h", **fields}
    return api.post(f"{prefix}/batches", headers=headers, json=body)


def create_batch(api: httpx.Client, content: bytes, endpoint: str = CHAT) -> str:
    """Upload ``content`` as a batch input file and create a 24 h batch on it: the batch's id.

    Both calls must answer 200 (what a batch then does is the test's to check)."""
    created = create(api, input_file_id=upload(api, content)["id"], endpoint=endpoint)
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
    interval_s: float = 0.2,
) -> dict[str, Any]:
    """The batch's JSON once it has ended, polled every ``interval_s``.

    ``seen`` (when given) gets each status the polls see that differs from its last entry."""

    def poll() -> dict[str, Any] | None:
        batch: dict[str, Any] = api.get(f"{prefix}/batches/{batch_id}", headers=headers).json()
        if seen is not None and (not seen or seen[-1] != batch["status"]):
            seen.append(batch["status"])
        return batch if batch["status"] in TERMINAL else None

    found: dict[str, Any] | None = wait_until(poll, timeout_s, f"batch {batch_id} to end", interval_s)
    assert found is not None
    return found


def assert_error(
    response: httpx.Response, status: int, code: str | object | None = ANY, param: str | None = None
) -> None:
    """``response`` is ``status`` with OpenAI's error body (a message, every field present).

    ``code`` is checked when given (``None``: it must be null); ``param`` when not ``None``."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    if code is not ANY:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
