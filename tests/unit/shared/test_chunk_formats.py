"""The result chunk record and the seen-lines bitmap: one definition, read back by every reader."""

from __future__ import annotations

import pytest

from services.aggregator.overdue import fill_record
from shared.protocol.messages import ResponsePayload, ResultMessage
from shared.result_chunks import Record, encode_record, parse_record
from shared.seen_lines import SeenLines


def test_a_record_parses_back_to_itself() -> None:
    record = Record(42, True, b'{"a":"b c"}')
    assert parse_record(record.encode()) == record


def test_results_and_fill_lines_encode_through_the_same_record() -> None:
    result = ResultMessage(
        request_id="batch_req_1",
        custom_id="c1",
        batch_id="batch_1",
        line=7,
        response=ResponsePayload(status_code=200, request_id="r", body={"text": "two\nlines"}),
    )
    written = parse_record(encode_record(result))
    assert (written.line, written.succeeded) == (7, True) and b"\n" not in written.payload
    filled = parse_record(fill_record("batch_1", 9, b'{"custom_id": "c9"}', "batch_expired"))
    assert (filled.line, filled.succeeded) == (9, False) and b'"custom_id":"c9"' in filled.payload


def test_seen_lines_refuses_line_zero_and_never_contains_it() -> None:
    seen = SeenLines()
    assert 0 not in seen and -3 not in seen
    with pytest.raises(ValueError):
        seen.add(0)
