"""Upload, create, wait and download in one step, with a progress display.

    python -m services.api.client requests.jsonl --output results.jsonl [--errors errors.jsonl]
        [--endpoint /v1/chat/completions] [--base-url http://127.0.0.1:10900/v1] [--api-key KEY]

Uses the unmodified ``openai`` SDK, so it works against OpenAI too. ``run_batch`` is the same
thing as a function. The key and base URL default to ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``,
then to the local stack's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from openai import OpenAI
from openai.types import Batch

from shared.protocol.openai import TERMINAL_STATUSES
from shared.settings import DEV_API_KEY

LOCAL_BASE_URL = "http://127.0.0.1:10900/v1"


class ProgressLine:
    """One status line, rewritten in place on a terminal and printed on change otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.last = ""

    def __call__(self, batch: Batch) -> None:
        counts = batch.request_counts
        done = (counts.completed + counts.failed) if counts else 0
        total = counts.total if counts else 0
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        text = f"{batch.id} {batch.status:<11} {done}/{total}"
        if total:
            width = 30
            filled = width * done // total
            text += f" [{'#' * filled}{'.' * (width - filled)}] {100 * done / total:5.1f}%"
            if counts and counts.failed:
                text += f" ({counts.failed} failed)"
            if rate > 0 and done < total:
                text += f" {rate:.1f} lines/s, ~{(total - done) / rate:.0f}s left"
        if text == self.last:
            return
        self.last = text
        if self.stream.isatty():
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream.isatty():
            self.stream.write("\n")


def run_batch(
    client: OpenAI,
    input_path: Path,
    output_path: Path,
    errors_path: Path | None = None,
    endpoint: str = "/v1/chat/completions",
    poll_s: float = 1.0,
    on_progress: Callable[[Batch], None] | None = None,
) -> Batch:
    """Run ``input_path`` as a batch; write the output (and error) lines; return the final batch."""
    with input_path.open("rb") as handle:
        uploaded = client.files.create(file=handle, purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )
    while True:
        if on_progress:
            on_progress(batch)
        if batch.status in TERMINAL_STATUSES:
            break
        time.sleep(poll_s)
        batch = client.batches.retrieve(batch.id)
    _download(client, batch.output_file_id, output_path)
    if errors_path is not None:
        _download(client, batch.error_file_id, errors_path)
    return batch


def _download(client: OpenAI, file_id: str | None, path: Path) -> None:
    with path.open("wb") as out:
        if file_id:
            with client.files.with_streaming_response.content(file_id) as response:
                for chunk in response.iter_bytes():
                    out.write(chunk)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.api.client", description=__doc__.split("\n")[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--errors", type=Path)
    parser.add_argument("--endpoint", default="/v1/chat/completions")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", LOCAL_BASE_URL))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", DEV_API_KEY))
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between status checks")
    args = parser.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    progress = ProgressLine(sys.stderr)
    try:
        batch = run_batch(client, args.input, args.output, args.errors, args.endpoint, args.poll, progress)
    finally:
        progress.close()
    if batch.status == "failed" and batch.errors and batch.errors.data:
        for error in batch.errors.data:
            print(f"line {error.line}: {error.code}: {error.message}", file=sys.stderr)
    return 0 if batch.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
