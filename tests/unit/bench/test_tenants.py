"""The tenants benchmark's input files and figures (no stack)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.tenants_client import Answer, HealthProbe, pending
from bench.tenants_files import write_huge_line_file, write_long_line
from bench.tenants_measure import error_name


@pytest.mark.parametrize("size", [300, 2**20 + 17, 3 * 2**20])
def test_a_long_line_is_one_request_of_exactly_its_size_without_a_newline(tmp_path: Path, size: int) -> None:
    path = tmp_path / "giant.jsonl"
    with path.open("wb") as out:
        write_long_line(out, size, "m", "giant")
    data = path.read_bytes()
    assert len(data) == size
    assert b"\n" not in data
    request = json.loads(data)
    assert request["custom_id"] == "giant"
    # Words, so that any engine counts the prompt as many tokens (over its context).
    assert len(request["body"]["messages"][0]["content"].split()) > (size - 300) // 6


def test_a_line_too_short_for_a_request_is_refused(tmp_path: Path) -> None:
    with (tmp_path / "x").open("wb") as out, pytest.raises(ValueError):
        write_long_line(out, 10, "m", "giant")


def test_the_huge_line_sits_among_short_ones_or_ends_the_file(tmp_path: Path) -> None:
    middle = write_huge_line_file(tmp_path / "a.jsonl", 5000, 4, "m", last=False).read_bytes()
    assert [len(line) for line in middle.split(b"\n")][2] == 5000
    assert middle.endswith(b"\n") and middle.count(b"\n") == 5
    last = write_huge_line_file(tmp_path / "b.jsonl", 5000, 4, "m", last=True).read_bytes()
    assert len(last.split(b"\n")[-1]) == 5000
    assert all(json.loads(line) for line in last.split(b"\n"))


def test_health_figures_count_only_the_polls_sent_in_the_window() -> None:
    probe = HealthProbe("http://127.0.0.1:1/health", 0.025)
    probe.polls = [
        (1.0, 9.0, 200),
        *((2.0 + i / 100, 0.01 * (i + 1), 200) for i in range(99)),
        (3.5, 2.0, 503),
    ]
    inside = probe.window(2.0, 3.5)
    assert inside["polls"] == 100
    assert inside["not_200"] == 1
    assert inside["p50_s"] == pytest.approx(0.51)  # nearest rank of 100
    assert inside["max_s"] == 2.0


def test_a_refusal_is_named_by_its_status_and_code() -> None:
    assert Answer(200, {"id": "batch_1"}).code == "ok"
    assert (
        Answer(429, {"error": {"code": "quota_exceeded", "type": "rate_limit"}}).code == "429 quota_exceeded"
    )
    assert Answer(413, {}).code == "413"
    assert not Answer(0, {"error": {"code": "WriteError"}}).ok  # the connection closed mid-upload


def test_pending_lines_are_those_of_running_batches_without_a_result() -> None:
    batches = {
        "a": {"status": "in_progress", "request_counts": {"total": 100, "completed": 30, "failed": 5}},
        "b": {"status": "validating", "request_counts": {"total": 0, "completed": 0, "failed": 0}},
        "c": {"status": "cancelled", "request_counts": {"total": 50, "completed": 10, "failed": 0}},
    }
    assert pending(batches) == 65


def test_an_error_line_is_named_by_its_code_or_by_its_type_and_status() -> None:
    assert error_name({"code": "line_too_large", "type": "invalid_request_error"}) == "line_too_large"
    assert error_name({"code": 400, "type": "BadRequestError"}) == "BadRequestError 400"
    assert error_name({}) == ""
