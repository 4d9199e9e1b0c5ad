"""Ending a batch before every line has a result: expiry and the cancel timeout.

``close_reason`` decides from the batch document alone whether a batch is overdue (the batch
store's ``overdue`` query is its filter form, for the sweep). The finalizer
then writes one error line per line still without a result (``batch_expired`` or
``batch_cancelled``) by streaming the input file from object storage, and merges those lines
after the result chunks, so a real result always wins over a fill line for the same number.
Lines are numbered by ``shared.input_lines`` (blank lines counted, then skipped).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from shared import lifecycle
from shared.documents import BatchDocument
from shared.input_lines import InputLine
from shared.protocol.messages import LineError, NotRunCode
from shared.result_chunks import Record, compact_json
from shared.seen_lines import SeenLines

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CloseReason:
    status: lifecycle.BatchStatus  # the terminal status: "expired" or "cancelled"
    code: NotRunCode  # the error code of every line without a result


EXPIRED = CloseReason("expired", "batch_expired")
CANCELLED = CloseReason("cancelled", "batch_cancelled")


def close_reason(batch: BatchDocument, now: float, cancel_timeout_s: float) -> CloseReason | None:
    """Why the batch must end now although lines lack results, or None when it need not."""
    if batch.status == "cancelling":
        cancelling_at = batch.cancelling_at
        # dispatch_settled: the api's dispatcher saw every line it sent come back (no wait).
        if cancelling_at is None or cancelling_at + cancel_timeout_s <= now or batch.dispatch_settled:
            return CANCELLED
        return None
    expires_at = batch.expires_at
    if batch.status in lifecycle.EXPIRABLE and expires_at is not None and expires_at <= now:
        return EXPIRED
    return None


def fill_request_id(batch_id: str, line: int) -> str:
    """A stable id for a line that never ran (the same on every re-run of a finalize)."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{line}".encode()).hexdigest()[:24]


def fill_record(batch_id: str, line: int, raw: bytes, code: NotRunCode) -> bytes:
    """One chunk-format record (``shared/result_chunks.py``) for a line that never ran."""
    try:
        item = json.loads(raw)
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
    except Exception:  # any line the parser cannot take (RecursionError too) has no custom_id
        custom_id = None
    payload = {
        "id": fill_request_id(batch_id, line),
        "custom_id": custom_id if isinstance(custom_id, str) else None,
        "response": None,
        "error": LineError.not_run(code).as_dict(),
    }
    return Record(line, False, compact_json(payload)).encode()


async def write_fill(
    batch_id: str, lines: AsyncIterator[InputLine], seen: SeenLines, code: NotRunCode, path: Path
) -> int:
    """Write a record for every request line not in ``seen``, in line order; returns how many.

    Holds one input line at a time (the bitmap is 6 KB for 50,000 lines).
    """
    written = 0
    with path.open("wb") as out:
        async for line in lines:
            if line.number in seen:
                continue
            out.write(fill_record(batch_id, line.number, line.raw, code))
            written += 1
    return written
