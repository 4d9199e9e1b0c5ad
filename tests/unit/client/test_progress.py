"""Written to a file or a pipe, the progress display prints one line per change of the counts."""

from __future__ import annotations

import io
import time

from openai.types import Batch
from rich.console import Console

from services.client.progress import BatchProgress


def batch(status: str, completed: int, failed: int, total: int) -> Batch:
    return Batch.model_validate(
        {
            "id": "batch_0123456789abcdef01234567",
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "input_file_id": "file-1",
            "completion_window": "24h",
            "status": status,
            "created_at": 1,
            "request_counts": {"total": total, "completed": completed, "failed": failed},
        }
    )


def test_one_line_per_change_with_counts_percent_and_failures() -> None:
    log = io.StringIO()
    with BatchProgress(Console(file=log, width=80)) as progress:
        for state in [
            batch("validating", 0, 0, 0),
            batch("in_progress", 2, 0, 8),
            batch("in_progress", 2, 0, 8),  # nothing changed: no line
            batch("in_progress", 5, 1, 8),
            batch("completed", 7, 1, 8),
        ]:
            progress(state)

    lines = log.getvalue().splitlines()
    assert len(lines) == 4
    assert "validating" in lines[0]
    assert "2/8" in lines[1] and "25%" in lines[1]
    assert "6/8" in lines[2] and "1 failed" in lines[2]
    assert "completed" in lines[3] and "8/8" in lines[3] and "100%" in lines[3]
    assert "lines/s" in lines[3]


def test_the_time_left_is_the_batch_s_own_estimate_while_it_has_one() -> None:
    log = io.StringIO()
    with BatchProgress(Console(file=log, width=80)) as progress:
        progress(batch("in_progress", 2, 0, 8))
        ahead = Batch.model_validate(
            {**batch("in_progress", 4, 0, 8).model_dump(), "estimated_completion_at": int(time.time()) + 125}
        )
        progress(ahead)
    lines = log.getvalue().splitlines()
    assert "ends in" not in lines[0]
    assert "ends in 0:02:0" in lines[1], lines[1]  # about 125 s from now
