"""The estimated completion time: by expected work from the workers' reports, else by lines."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from shared.completion_estimate import FIELD, FRESH_S, EngineProgress, estimate, worker_key
from shared.documents import BatchDocument
from shared.protocol.openai import RequestCounts


def report(at: float, **fields: Any) -> dict[str, Any]:
    return EngineProgress(at=at, **fields).model_dump()


def test_the_work_left_at_the_workers_rate_gives_the_end() -> None:
    # 10,000 expected tokens: 3,000 finished, 1,000 come by the running lines; 6,000 left at
    # 100 + 200 tokens/s: 20 s after the newest report.
    reports = {
        "a": report(1_000.0, finished_tokens=1_000, running_tokens=400.0, rate=100.0, longest_s=3.0),
        "b": report(1_002.0, finished_tokens=2_000, running_tokens=600.0, rate=200.0, longest_s=5.0),
    }
    at, lines, tokens = estimate(50, 10_000, reports, [1_001.0, 4.0], now=1_003.0)
    assert (at, lines, tokens) == (1_022, 4.0, 300.0)


def test_the_longest_running_line_bounds_the_end() -> None:
    # Little work left but one line needs 30 s more: the batch cannot end before it does.
    reports = {"a": report(1_000.0, finished_tokens=9_000, running_tokens=900.0, rate=50.0, longest_s=30.0)}
    assert estimate(1, 10_000, reports, None, now=1_001.0)[0] == 1_030


def test_a_stale_report_counts_its_finished_lines_only() -> None:
    stale_at = 1_000.0 - FRESH_S - 1
    reports = {
        "gone": report(stale_at, finished_tokens=4_000, running_tokens=3_000.0, rate=500.0, longest_s=99.0),
        "live": report(1_000.0, finished_tokens=1_000, running_tokens=0.0, rate=100.0),
    }
    # 10,000 - 4,000 - 1,000 = 5,000 left at the live worker's 100/s; the gone one's rate, running
    # lines and their bound count for nothing.
    assert estimate(10, 10_000, reports, None, now=1_000.5)[:3:2] == (1_050, 100.0)
    # Once no worker has reported lately (the only one stopped), the lines decide.
    later = 1_000.0 + FRESH_S + 1
    assert estimate(10, 10_000, {"live": reports["live"]}, [later, 2.0], now=later)[:3:2] == (later + 5, None)


def test_without_expected_work_or_a_worker_rate_the_line_rate_decides() -> None:
    by_lines = (2_031, 20.0, None)  # 600 lines at 20/s from 2,000.25, rounded up
    rate = [2_000.25, 20.0]
    now = 2_001.0
    assert (
        estimate(600, None, {"a": report(2_000.0, rate=100.0)}, rate, now) == by_lines
    )  # a line without a cap
    assert estimate(600, 10_000, None, rate, now) == by_lines  # no worker reported
    assert estimate(600, 10_000, {"a": report(2_000.0, running=0)}, rate, now) == by_lines  # none running
    assert estimate(600, 10_000, None, None, now) == (None, None, None)


def test_the_reports_field_is_the_batch_document_s() -> None:
    assert FIELD in BatchDocument.model_fields


def test_worker_names_become_field_names() -> None:
    assert worker_key("node-1.cluster.local:42") == "node-1_cluster_local:42"
    assert worker_key("a$b") == "a_b"


def batch(done: int, status: str = "in_progress", **fields: Any) -> BatchDocument:
    """A batch of 1,000 lines, ``done`` of them with a result, stored with ``fields``."""
    return BatchDocument.model_validate(
        {
            "_id": "b",
            "endpoint": "/v1/chat/completions",
            "input_file_id": "f",
            "status": status,
            "created_at": 1,
            "request_counts": RequestCounts(total=1_000, completed=done - 1, failed=1).model_dump(),
            **fields,
        }
    )


def test_the_batch_object_shows_when_its_remaining_lines_end_at_its_rate() -> None:
    shown = batch(400, completion_rate=[2_000.25, 20.0]).public()
    assert shown.estimated_completion_at == 2_031  # 600 lines at 20/s from 2,000.25, rounded up
    assert shown.estimated_rate_lines_per_s == 20.0
    unknown = batch(400, completion_rate=None).public()
    assert (unknown.estimated_completion_at, unknown.estimated_rate_lines_per_s) == (None, None)
    ended = batch(1_000, status="completed", completion_rate=[2_000.0, 20.0]).public()
    assert (ended.estimated_completion_at, ended.estimated_rate_lines_per_s) == (None, None)


def test_the_batch_object_shows_the_work_estimate_and_its_rate() -> None:
    at = time.time()
    progress = {"w": report(at, finished_tokens=400, running_tokens=100.0, rate=25.0)}
    shown = batch(40, expected_tokens=1_000, engine_progress=progress).public()
    assert shown.estimated_completion_at == math.ceil(at + 20)  # 500 tokens left at 25/s
    assert shown.estimated_rate_tokens_per_s == pytest.approx(25.0)
    assert shown.estimated_rate_lines_per_s is None  # the aggregator has not told it yet
    ended = batch(40, status="completed", expected_tokens=1_000, engine_progress=progress).public()
    assert (ended.estimated_completion_at, ended.estimated_rate_tokens_per_s) == (None, None)
