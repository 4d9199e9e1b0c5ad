from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from functools import partial
from pathlib import Path

import pytest

from services.aggregator import chunks as chunks_module
from services.aggregator.chunks import (
    encode_chunk,
    merge_and_split,
    merge_sorted,
    parse_record,
    read_records,
)
from shared.protocol.messages import LineError, ResponsePayload, ResultMessage
from shared.protocol.result_message import NotRunCode


def result(line: int, status: int = 200, tag: str = "") -> ResultMessage:
    return ResultMessage(
        request_id=f"batch_req_{line}{tag}",
        custom_id=f"c{line}",
        batch_id="batch_1",
        line=line,
        response=ResponsePayload(status_code=status, request_id=f"r{line}", body={"text": "a\nb\t c"}),
    )


def write_chunk(path: Path, lines: list[int], failed: AbstractSet[int] = frozenset(), tag: str = "") -> Path:
    path.write_bytes(encode_chunk(result(n, 400 if n in failed else 200, tag) for n in lines))
    return path


def test_record_roundtrip_keeps_output_line() -> None:
    raw = encode_chunk([result(7, 400)])
    record = parse_record(raw)
    assert record.line == 7 and not record.succeeded
    assert json.loads(record.payload) == result(7, 400).output_line()
    assert raw.count(b"\n") == 1  # newlines inside bodies stay escaped


def test_merge_sorted_dedupes_and_prefers_first_stream() -> None:
    a = [parse_record(r) for r in encode_chunk([result(1, tag="a"), result(3, tag="a")]).splitlines()]
    b = [parse_record(r) for r in encode_chunk([result(2, tag="b"), result(3, tag="b")]).splitlines()]
    merged = list(merge_sorted([a, b]))
    assert [r.line for r in merged] == [1, 2, 3]
    assert json.loads(merged[2].payload)["id"] == "batch_req_3a"


def test_merge_and_split_with_duplicates_across_chunks(tmp_path: Path) -> None:
    chunks = [
        write_chunk(tmp_path / "c0", [1, 4, 5], failed={4}),
        write_chunk(tmp_path / "c1", [2, 4, 6]),  # 4 again (redelivered), counted once
        write_chunk(tmp_path / "c2", [3, 5, 7], failed={7}),
    ]
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    split = merge_and_split(chunks, tmp_path, out, err)
    assert (split.completed, split.failed) == (5, 2)
    assert [json.loads(x)["custom_id"] for x in out.read_bytes().splitlines()] == [
        "c1",
        "c2",
        "c3",
        "c5",
        "c6",
    ]
    assert [json.loads(x)["custom_id"] for x in err.read_bytes().splitlines()] == ["c4", "c7"]
    assert split.output_bytes == out.stat().st_size and split.error_bytes == err.stat().st_size


def test_the_split_counts_the_lines_that_never_ran_by_code(tmp_path: Path) -> None:
    def never_ran(line: int, code: NotRunCode) -> ResultMessage:
        base = result(line)
        return ResultMessage(
            request_id=base.request_id,
            custom_id=base.custom_id,
            batch_id=base.batch_id,
            line=line,
            error=LineError.not_run(code),
        )

    quoting = ResultMessage(  # a failed response whose body quotes a not-run code: it ran
        request_id="r9",
        custom_id="c9",
        batch_id="batch_1",
        line=9,
        response=ResponsePayload(status_code=400, request_id="r9", body={"error": {"code": "batch_expired"}}),
    )
    results = [result(1), never_ran(2, "batch_cancelled"), never_ran(3, "batch_cancelled")]
    results += [never_ran(4, "batch_expired"), result(5, 400), quoting]
    chunk = tmp_path / "c0"
    chunk.write_bytes(encode_chunk(results))
    split = merge_and_split([chunk], tmp_path, tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    assert (split.completed, split.failed) == (1, 5)
    assert split.not_run == {"batch_cancelled": 2, "batch_expired": 1}


def test_merge_in_passes_when_many_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 300 one-line chunks with every line written twice: more than the fan-in, so merged in passes.
    monkeypatch.setattr(chunks_module, "reduce_fan_in", partial(chunks_module.reduce_fan_in, fan_in=64))
    chunks = [write_chunk(tmp_path / f"c{i:04d}", [i % 150 + 1]) for i in range(300)]
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    split = merge_and_split(chunks, tmp_path, out, err)
    assert split.completed == 150 and split.failed == 0
    assert len(list(tmp_path.glob("merge-0-*.chunk"))) == 5  # a first pass of five 64-file merges
    with out.open("rb") as f:
        assert [json.loads(x)["custom_id"] for x in f] == [f"c{n}" for n in range(1, 151)]
    with chunks[0].open("rb") as f:
        assert [r.line for r in read_records(f)] == [1]
