"""The batch's estimated completion time on a real stack, where a line rate would mislead: the
long lines run first (longest first) and the short ones finish around them, so when half the
lines are done the work left is mostly the long lines'.

A stack of its own on the session's stand-ins: api, aggregator and one worker on the fake
engine, paced (each line takes ``PACE_S`` per ``max_tokens``) with ``PLACES`` places, so lines
of known lengths run side by side as on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from pymongo import MongoClient

from deploy.local import ModelSpec, Stack
from shared.completion_estimate import FIELD
from tests.support.lines import chat_line
from tests.support.stacks import FAKE_STACK_ENV, OwnStack
from tests.support.waiting import TERMINAL

pytestmark = pytest.mark.e2e
MODEL = "fake-paced"
PACE_S = 0.05
PLACES = 16
LONG, SHORT = (8, 300), (120, 10)  # (lines, max_tokens): 15 s and 0.5 s a line


@pytest.fixture(scope="module")
def paced_stack(own_stack: OwnStack) -> Iterator[Stack]:
    model = ModelSpec("", MODEL, engine="fake")
    paced = {
        "BATCHSTREAM_INFERENCE_FAKE_SECONDS_PER_TOKEN": str(PACE_S),
        "BATCHSTREAM_INFERENCE_FAKE_MAX_RUNNING": str(PLACES),
    }
    with own_stack(
        "eta", ["api", "aggregator", model.component], models=[model], extra_env={**FAKE_STACK_ENV, **paced}
    ) as stack:
        yield stack


def test_the_estimate_counts_the_long_lines_still_running(paced_stack: Stack) -> None:
    client = OpenAI(base_url=paced_stack.base_url, api_key=paced_stack.api_key, max_retries=5)
    # The long lines last in the file: longest first sends them first.
    lines = [chat_line(f"short-{n}", MODEL, max_tokens=SHORT[1]) for n in range(SHORT[0])]
    lines += [chat_line(f"long-{n}", MODEL, max_tokens=LONG[1]) for n in range(LONG[0])]
    upload = client.files.create(file=("mixed.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    total = len(lines)
    # (at, done, estimate, tokens/s, lines/s)
    seen: list[tuple[float, int, int | None, float | None, float | None]] = []
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch.id)).status not in TERMINAL:
        counts = batch.request_counts
        extra = batch.model_extra or {}
        if batch.status == "in_progress" and counts is not None:
            seen.append(
                (
                    time.time(),
                    counts.completed + counts.failed,
                    extra.get("estimated_completion_at"),
                    extra.get("estimated_rate_tokens_per_s"),
                    extra.get("estimated_rate_lines_per_s"),
                )
            )
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    ended = time.time()
    assert batch.status == "completed", batch
    half = next((s for s in seen if s[1] >= total / 2), None)
    assert half is not None, seen
    at, done, estimate, tokens_per_s, lines_per_s = half
    assert estimate is not None and tokens_per_s is not None, seen  # by the work, not the lines
    error = (estimate - ended) / (ended - at)
    by_lines = f"{(at + (total - done) / lines_per_s - ended) / (ended - at):+.0%}" if lines_per_s else "-"
    left = ended - at
    print(f"\nat {done}/{total} lines, {left:.1f} s before the end: {error:+.0%} (by lines: {by_lines})")
    # By its lines, the batch would end with its short lines; its long ones run on.
    assert abs(error) <= 0.35, seen
    # The batch's expected tokens, and the workers' reports on its document.
    env = paced_stack.env()
    mongo: MongoClient[dict[str, Any]]
    with MongoClient(env["BATCHSTREAM_MONGO_URI"]) as mongo:
        doc: dict[str, Any] = (
            mongo[env["BATCHSTREAM_MONGO_DATABASE"]]["batches"].find_one({"_id": batch.id}) or {}
        )
    assert doc.get("expected_tokens") == LONG[0] * LONG[1] + SHORT[0] * SHORT[1]
    reports = doc.get(FIELD) or {}
    assert sum(r["finished_lines"] for r in reports.values()) >= total / 2, reports
