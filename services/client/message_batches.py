"""Message batches (Anthropic's Message Batches API) from the ``batchstream`` command: submit a
file of batch requests, then read the batch's results in Anthropic's shape.

Only the ``openai`` SDK's client is used (its key as ``Authorization: Bearer``, which the Message
Batches routes take beside ``x-api-key``): a message batch is a batch, so it is waited for like
any other (``output.wait_with_progress``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import httpx2
import typer
from openai import OpenAI
from openai.types import Batch

from services.client.output import (
    InputFile,
    JsonFlag,
    PollFlag,
    WaitFlag,
    as_dict,
    beside,
    err,
    finish,
    out,
    print_json,
    wait_with_progress,
)


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


def messages_command(
    ctx: typer.Context,
    input_path: InputFile,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where the results go (default: FILE.results.jsonl)."),
    ] = None,
    poll: PollFlag = 1.0,
    wait_for_it: WaitFlag = True,
    as_json: JsonFlag = False,
) -> None:
    """Submit FILE as a message batch (Anthropic's Message Batches API: one `{"custom_id",
    "params"}` request per line), show its progress, download its results in Anthropic's shape.

    Exits as `submit` does: 0 completed, 1 failed, 3 expired, 4 cancelled, 5 api error (a bad
    request is named by the api), 130 interrupted.
    """
    client: OpenAI = ctx.obj.client()  # the command's connection (cli.py)
    output = output or beside(input_path, "results")
    created = submit_messages(client, input_path)
    if not wait_for_it:
        print_json(as_dict(created)) if as_json else out.print(created.id)
        return
    batch = wait_with_progress(client, created, poll)
    written = download_message_results(client, batch.id, output)
    if not as_json:
        err.print(f"{batch.id} {batch.status}: {written} results to {output}", markup=False, soft_wrap=True)
    finish(batch, as_json)
