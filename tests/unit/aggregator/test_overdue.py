from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from services.aggregator.chunks import merge_and_split
from services.aggregator.overdue import (
    CANCELLED,
    EXPIRED,
    close_reason,
    fill_request_id,
    write_fill,
)
from services.aggregator.state import SeenLines
from shared.documents import BatchDocument
from shared.input_lines import InputLine, request_lines
from shared.lifecycle import BatchStatus


def batch(status: BatchStatus, **fields: Any) -> BatchDocument:
    return BatchDocument(
        _id="batch_1",
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        created_at=0,
        status=status,
        **fields,
    )


def test_close_reason() -> None:
    now = 1_000.0
    assert close_reason(batch("in_progress", expires_at=999), now, 60) == EXPIRED
    assert close_reason(batch("validating", expires_at=1000), now, 60) == EXPIRED
    assert close_reason(batch("finalizing", expires_at=999), now, 60) == EXPIRED
    assert close_reason(batch("in_progress", expires_at=1001), now, 60) is None
    assert close_reason(batch("cancelling", cancelling_at=940), now, 60) == CANCELLED
    assert close_reason(batch("cancelling", cancelling_at=941), now, 60) is None
    # The dispatcher saw every line it sent come back: no need to wait for the timeout.
    assert close_reason(batch("cancelling", cancelling_at=990, dispatch_settled=True), now, 60) == CANCELLED
    # The cancel timeout wins over expiry while cancelling; terminal batches are never closed.
    assert close_reason(batch("cancelling", cancelling_at=990, expires_at=0), now, 60) is None
    assert close_reason(batch("completed", expires_at=0), now, 60) is None


def lines(*items: bytes) -> AsyncIterator[InputLine]:
    """The request lines of a file made of ``items``, numbered as every service numbers them."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b"\n".join(items)

    return request_lines(chunks())


def request(custom_id: str) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/x", "body": {}}).encode()


async def test_fill_numbers_every_line_and_skips_seen_and_blank(tmp_path: Path) -> None:
    seen = SeenLines()
    seen.add(2)
    path = tmp_path / "fill.chunk"
    written = await write_fill(
        "b1", lines(request("a"), request("b"), b"", request("c")), seen, "batch_expired", path
    )
    assert written == 2
    records = [raw.split(b" ", 2) for raw in path.read_bytes().splitlines()]
    assert [(int(n), ok) for n, ok, _ in records] == [(1, b"0"), (4, b"0")]
    first = json.loads(records[0][2])
    assert first["custom_id"] == "a" and first["response"] is None
    assert first["error"]["code"] == "batch_expired" and first["id"] == fill_request_id("b1", 1)


async def test_real_results_win_over_fill_lines(tmp_path: Path) -> None:
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b'2 1 {"custom_id":"b","ok":true}\n')
    fill = tmp_path / "fill.chunk"
    # Line 2 is in the fill too (a result written but not yet marked seen before a crash).
    await write_fill("b1", lines(request("a"), request("b")), SeenLines(), "batch_cancelled", fill)
    out, err = tmp_path / "out", tmp_path / "err"
    split = merge_and_split([chunk, fill], tmp_path, out, err)
    assert (split.completed, split.failed) == (1, 1)
    assert json.loads(out.read_text())["ok"] is True
    assert json.loads(err.read_text())["custom_id"] == "a"
