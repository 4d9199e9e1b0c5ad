"""A 200 MB / 50,000-line batch input streams through the api: its memory stays bounded."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from openai import OpenAI

from deploy.local.stack import Stack
from tests.support.lines import chat_line
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

LINES = 50_000
LINE_BYTES = 4_000
RSS_LIMIT = 300 * 1024 * 1024


class PeakRss:
    """Samples a process's resident memory in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def write_input(path: Path, model: str) -> int:
    with path.open("w") as out:
        for i in range(LINES):
            line = chat_line(f"row-{i}", model, "")
            pad = LINE_BYTES - len(line) - 1
            out.write(line.replace('"content": ""', f'"content": "{"x" * (pad - 0)}"') + "\n")
    return path.stat().st_size


def test_a_200_mb_input_streams_through_the_api_in_bounded_memory(
    stack: Stack, client: OpenAI, unserved_model: str, mongo_db: Any, tmp_path: Path
) -> None:
    source = tmp_path / "big.jsonl"
    size = write_input(source, unserved_model)
    assert size == LINES * LINE_BYTES
    api_pid = stack.pid("api")
    assert api_pid is not None

    with PeakRss(api_pid) as rss:
        started = time.monotonic()
        with source.open("rb") as handle:
            uploaded = client.files.create(file=handle, purpose="batch")
        uploaded_at = time.monotonic()
        assert uploaded.bytes == size
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        # Validated and handed to the dispatcher (its lines wait in object storage: no worker).
        wait_until(
            lambda: (mongo_db.batches.find_one({"_id": batch.id}) or {}).get("dispatchable"),
            240,
            "validated and handed to the dispatcher",
            interval_s=0.2,
        )
        emitted_at = time.monotonic()
        downloaded = 0
        with client.files.with_streaming_response.content(uploaded.id) as response:
            for chunk in response.iter_bytes():
                downloaded += len(chunk)

    assert downloaded == size
    running = client.batches.retrieve(batch.id)
    assert running.status == "in_progress"
    assert running.request_counts is not None and running.request_counts.total == LINES
    print(
        f"api peak RSS {rss.peak / 2**20:.0f} MiB for a {size / 1e6:.0f} MB input; upload "
        f"{uploaded_at - started:.1f} s, validate {emitted_at - uploaded_at:.1f} s, "
        f"download {time.monotonic() - emitted_at:.1f} s"
    )
    assert rss.peak < RSS_LIMIT, f"api peak RSS {rss.peak / 2**20:.0f} MiB"
    client.batches.cancel(batch.id)
