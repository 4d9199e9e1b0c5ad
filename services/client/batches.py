"""The old client's flow in one call: upload, create (with batch-level defaults), wait, download.

``run_batch`` is the whole flow; ``submit``, ``wait`` and ``download_results`` are its steps, which
the ``batchstream submit`` command uses to show the batch id before it waits. Only the ``openai``
SDK is used: batchstream's batch-level defaults (``max_decoding_length``, ``max_context_length``,
``temperature``, ``top_p``, ``top_k``) travel as extra body fields, which OpenAI itself would reject,
so leave them unset there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from openai import OpenAI
from openai.types import Batch

from services.client.connection import connect
from shared.lifecycle import TERMINAL
from shared.protocol.messages import SamplingDefaults
from shared.protocol.openai import COMPLETION_WINDOW

# The exit status of `batchstream submit` and `batchstream batches wait`, by the batch's outcome.
EXIT_CODES: dict[str, int] = {"completed": 0, "failed": 1, "expired": 3, "cancelled": 4}
EXIT_API_ERROR = 5  # the api answered an error or could not be reached
EXIT_INTERRUPTED = 130  # Ctrl-C while waiting; the batch keeps running

Progress = Callable[[Batch], None]


def submit(
    client: OpenAI,
    input_path: str | Path,
    *,
    endpoint: str = "/v1/chat/completions",
    completion_window: str = COMPLETION_WINDOW,
    metadata: Mapping[str, str] | None = None,
    defaults: SamplingDefaults | None = None,
    mixed_models: bool = False,
) -> Batch:
    """Upload ``input_path`` and create a batch from it; returns the new batch (``validating``).
    ``mixed_models``: its lines may name several models and LoRA adapters (batchstream's)."""
    with Path(input_path).open("rb") as handle:
        uploaded = client.files.create(file=handle, purpose="batch")
    extra_body = defaults.model_dump(exclude_none=True) if defaults else {}
    if mixed_models:
        extra_body["mixed_models"] = True
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window=completion_window,  # type: ignore[arg-type]
        metadata=dict(metadata) if metadata else None,
        extra_body=extra_body or None,
    )


def retry(client: OpenAI, batch_id: str, codes: Sequence[str] | None = None) -> Batch:
    """A new batch of ``batch_id``'s failed lines (only those with one of ``codes``, if given):
    batchstream's ``POST /v1/batches/{id}/retry``; its metadata names the parent in ``retry_of``."""
    body = {"codes": list(codes)} if codes else {}
    return client.post(f"/batches/{batch_id}/retry", body=body, cast_to=Batch)


def wait(
    client: OpenAI,
    batch: Batch | str,
    *,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
    on_progress: Progress | None = None,
) -> Batch:
    """Poll until the batch is terminal; ``on_progress`` sees every state read. Returns the last."""
    current = client.batches.retrieve(batch) if isinstance(batch, str) else batch
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if on_progress:
            on_progress(current)
        if current.status in TERMINAL:
            return current
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"batch {current.id} still {current.status} after {timeout_s:g}s")
        time.sleep(poll_s)
        current = client.batches.retrieve(current.id)


def download(client: OpenAI, file_id: str | None, path: str | Path) -> None:
    """Stream a file's content to ``path``; an empty file when there is none (``file_id`` None)."""
    with Path(path).open("wb") as out:
        if file_id:
            with client.files.with_streaming_response.content(file_id) as response:
                for chunk in response.iter_bytes():
                    out.write(chunk)


def download_results(
    client: OpenAI, batch: Batch, output_path: str | Path, errors_path: str | Path | None = None
) -> None:
    """Write the output (and error) lines; both paths are written, empty when the batch has none."""
    download(client, batch.output_file_id, output_path)
    if errors_path is not None:
        download(client, batch.error_file_id, errors_path)


def run_batch(
    input_path: str | Path,
    output_path: str | Path,
    errors_path: str | Path | None = None,
    *,
    client: OpenAI | None = None,
    endpoint: str = "/v1/chat/completions",
    completion_window: str = COMPLETION_WINDOW,
    metadata: Mapping[str, str] | None = None,
    defaults: SamplingDefaults | None = None,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
    on_progress: Progress | None = None,
) -> Batch:
    """Run ``input_path`` as one batch and write its results; returns the final batch.

    ``client`` defaults to ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, then the local stack. The
    sampling ``defaults`` apply to every line whose body does not set the same field. Check
    ``batch.status`` (``EXIT_CODES`` maps it to a process exit status) and, when ``failed``,
    ``batch.errors.data`` for every bad input line.
    """
    client = client or connect()
    created = submit(
        client,
        input_path,
        endpoint=endpoint,
        completion_window=completion_window,
        metadata=metadata,
        defaults=defaults,
    )
    batch = wait(client, created, poll_s=poll_s, timeout_s=timeout_s, on_progress=on_progress)
    download_results(client, batch, output_path, errors_path)
    return batch
