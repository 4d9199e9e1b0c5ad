"""The tail benchmark's file and figures (no stack)."""

from __future__ import annotations

import json

from bench.tail import figures, longest_first, tail_lines


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
