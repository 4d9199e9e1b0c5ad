"""Message batches (Anthropic's Message Batches API) from the ``batchstream`` command: submit a
file of batch requests, then read the batch's results in Anthropic's shape.

Only the ``openai`` SDK's client is used (its key as ``Authorization: Bearer``, which the Message
Batches routes take beside ``x-api-key``): a message batch is a batch, so it is waited for like
any other (``batches.wait``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
from openai import OpenAI
from openai.types import Batch


def read_requests(input_path: str | Path) -> list[dict[str, Any]]:
    """The file's requests: one JSON object per non-blank line, ``{"custom_id", "params"}`` (the
    entries of ``requests`` in ``POST /v1/messages/batches``); the api checks each one."""
    with Path(input_path).open("rb") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def submit_messages(client: OpenAI, input_path: str | Path) -> Batch:
    """Create a message batch of the file's requests; returns it as the batch it is."""
    created = client.post("/messages/batches", body={"requests": read_requests(input_path)}, cast_to=object)
    return client.batches.retrieve(created["id"])  # type: ignore[index]


def download_message_results(client: OpenAI, batch_id: str, path: str | Path) -> int:
    """Write an ended message batch's results (one JSON line per request) to ``path``; returns
    how many lines were written."""
    written = 0
    url = f"{str(client.base_url).rstrip('/')}/messages/batches/{batch_id}/results"
    headers = {"Authorization": f"Bearer {client.api_key}"}
    with Path(path).open("wb") as out, httpx2.stream("GET", url, headers=headers, timeout=60) as response:
        if response.is_error:
            response.read()
            raise client._make_status_error_from_response(response)
        for line in response.iter_lines():
            if line:
                out.write(line.encode() + b"\n")
                written += 1
    return written
