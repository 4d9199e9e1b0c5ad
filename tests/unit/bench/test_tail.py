"""The tail benchmark's file and figures (no stack)."""

from __future__ import annotations

import json

import pytest

from bench.tail import PROGRESS, done_times, eta_error, figures, longest_first, tail_lines


def test_the_tail_file_is_a_tenth_long_spread_through_and_at_the_end() -> None:
    lines = [json.loads(x) for x in tail_lines(200, short=32, long=1024)]
    long_at = [n for n, x in enumerate(lines) if x["body"]["max_tokens"] == 1024]
    assert len(long_at) == 20
    assert all(x["body"]["min_tokens"] == x["body"]["max_tokens"] for x in lines)  # lengths held
    assert sum(1 for n in long_at if n >= 190) == 10  # half in the last twentieth
    assert min(long_at) < 40 and sum(1 for n in long_at if n < 190) == 10  # half spread through


def test_sorted_by_hand_is_longest_first_and_otherwise_in_file_order() -> None:
    lines = tail_lines(40, short=8, long=64)
    ids = [json.loads(x)["custom_id"] for x in longest_first(lines)]
    longs = [json.loads(x)["custom_id"] for x in lines if json.loads(x)["body"]["max_tokens"] == 64]
    assert ids[: len(longs)] == longs
    assert ids[len(longs) :] == [
        json.loads(x)["custom_id"] for x in lines if json.loads(x)["custom_id"] not in longs
    ]


def test_the_tail_runs_from_90_percent_of_lines_done_to_the_last() -> None:
    found = figures([float(n) for n in range(1, 11)])  # ten lines, one a second
    assert found == {"end_s": 10.0, "tail_s": 1.0}


def test_a_file_can_hold_a_given_number_of_long_lines() -> None:
    lines = [json.loads(x) for x in tail_lines(2000, short=32, long=1024, longs=4)]
    long_at = [n for n, x in enumerate(lines) if x["body"]["max_tokens"] == 1024]
    assert len(long_at) == 4 and long_at[-2:] == [1998, 1999]


def test_run_batch_progress_samples_become_each_lines_finish_time() -> None:
    found = PROGRESS.search("Running batch:  40% Completed | 4/10 [00:05<00:07,  0.80req/s]")
    assert found is not None and found.group(1) == "4"
    # seen at 105 s (4 done) and 110 s (10 done), the lines queued at 100 s
    assert done_times([(105.0, 4), (110.0, 10)], start=100.0) == [5.0] * 4 + [10.0] * 6


def test_the_eta_error_is_against_the_time_left_when_it_was_read() -> None:
    # read at 50 s, estimated 100 s, ended at 110 s: 10 s early out of 60 s left
    assert eta_error(100.0, end_s=110.0, seen_s=50.0) == pytest.approx(-10 / 60)
    assert eta_error(None, end_s=110.0, seen_s=50.0) is None  # no estimate yet
