from __future__ import annotations

from typing import Any

from services.aggregator.state import MAX_LINES, BatchState, SeenLines, usage_of
from shared.protocol.messages import LineError, ResponsePayload, ResultMessage


def result(line: int | None, status: int = 200, usage: dict[str, Any] | None = None) -> ResultMessage:
    body: dict[str, Any] = {"object": "chat.completion"}
    if usage is not None:
        body["usage"] = usage
    return ResultMessage(
        request_id=f"batch_req_{line}",
        custom_id=f"c{line}",
        batch_id="batch_1",
        line=line,
        response=ResponsePayload(status_code=status, request_id=f"r{line}", body=body),
    )


def test_bitmap_add_contains_count() -> None:
    seen = SeenLines()
    for line in (1, 8, 9, 50_000):
        seen.add(line)
    assert 1 in seen and 8 in seen and 9 in seen and 50_000 in seen
    assert 2 not in seen and 49_999 not in seen and 60_000 not in seen
    assert seen.count() == 4


def test_bitmap_roundtrip_is_compact() -> None:
    seen = SeenLines()
    for line in range(1, 50_001):
        seen.add(line)
    text = seen.encode()
    assert len(text) < 200  # 6.25 KB raw, all ones compress to almost nothing
    again = SeenLines.decode(text)
    assert again.count() == 50_000 and 50_000 in again and 50_001 not in again


def test_select_new_drops_seen_repeats_and_bad_lines() -> None:
    state = BatchState()
    fresh, dups, invalid = state.select_new([result(3), result(1), result(3), result(0)], total=3)
    assert [r.line for r in fresh] == [1, 3]
    assert (dups, invalid) == (1, 1)
    state.record(fresh)
    fresh, dups, invalid = state.select_new([result(1), result(2), result(None)], total=3)
    assert [r.line for r in fresh] == [2] and (dups, invalid) == (1, 1)


def test_line_numbers_above_total_are_valid() -> None:
    """Blank input lines are numbered but not counted in the total: line 5 of 4 requests is fine."""
    fresh, _, invalid = BatchState().select_new([result(5)], total=4)
    assert [r.line for r in fresh] == [5] and invalid == 0


def test_unknown_total_caps_lines() -> None:
    _, _, invalid = BatchState().select_new([result(MAX_LINES + 1), result(None)], total=0)
    assert invalid == 2


def test_record_counts_and_sums_usage_of_successes_only() -> None:
    state = BatchState()
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    state.record([result(1, usage=usage), result(2, usage=usage), result(3, 400, usage=usage)])
    assert (state.completed, state.failed, state.done) == (2, 1, 3)
    doc = state.usage_document()
    assert doc["input_tokens"] == 20 and doc["output_tokens"] == 10 and doc["total_tokens"] == 30
    assert doc["input_tokens_details"] == {"cached_tokens": 4}


def test_record_sums_responses_usage_in_the_batch_terms() -> None:
    state = BatchState()
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 8},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 1},
        "total_tokens": 15,
    }
    state.record([result(1, usage=usage), result(2, usage=usage)])
    assert state.usage_document() == {
        "input_tokens": 24,
        "input_tokens_details": {"cached_tokens": 16},
        "output_tokens": 6,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 30,
    }


def test_usage_of_embeddings_and_errors() -> None:
    assert usage_of(result(1, usage={"prompt_tokens": 7, "total_tokens": 7}))["total_tokens"] == 7
    assert usage_of(result(1, usage={"prompt_tokens": 3, "completion_tokens": 4}))["total_tokens"] == 7
    never_ran = ResultMessage(
        request_id="r",
        custom_id="c",
        batch_id="b",
        line=1,
        error=LineError(code="batch_cancelled", message="cancelled"),
    )
    assert usage_of(never_ran) == {}
    assert usage_of(result(1, usage={"prompt_tokens": "x", "completion_tokens": True})) == {
        "input_tokens": 0,
        "output_tokens": 0,
        "total_tokens": 0,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
    }


def test_state_dict_roundtrip() -> None:
    state = BatchState()
    state.record([result(2, usage={"prompt_tokens": 1, "completion_tokens": 1}), result(5, 500)])
    again = BatchState.from_dict(state.to_dict())
    assert again.to_dict() == state.to_dict()
    assert 2 in again.seen and 5 in again.seen and 3 not in again.seen
    assert BatchState.from_dict(None).done == 0
