"""Per-batch aggregation state: counts, usage sums and a compact bitmap of the lines seen.

The state lives in a faust table as a JSON dict (see ``tables.py``). The bitmap
(``shared/seen_lines.py``) is stored zlib-compressed and base64-encoded: a 50,000-line batch is
6.25 KB raw and a few bytes once every line is seen, so one changelog record per batch per chunk
stays small.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.documents import BatchDocument
from shared.protocol.messages import ResultMessage
from shared.result_chunks import USAGE_KEYS, token_sums, usage_document, usage_flat
from shared.seen_lines import MAX_LINE_NUMBER, SeenLines

__all__ = ["MAX_LINES", "USAGE_FIELDS", "BatchState", "SeenLines", "usage_of"]

# A guard against a corrupt line number allocating a huge bitmap.
MAX_LINES = MAX_LINE_NUMBER
USAGE_FIELDS = USAGE_KEYS


def usage_of(result: ResultMessage) -> dict[str, int]:
    """Token usage of a successful result, in the Batch object's ``usage`` terms.

    The result message carries the body's usage beside the raw body (``usage``,
    read from the body for an older message), so the body itself is never parsed here.
    """
    return token_sums(result.usage) if result.succeeded else {}


@dataclass
class BatchState:
    """What the aggregator knows about one batch; ``seen`` is the source of truth for dedupe."""

    completed: int = 0
    failed: int = 0
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_FIELDS, 0))
    seen: SeenLines = field(default_factory=SeenLines)

    @property
    def done(self) -> int:
        return self.completed + self.failed

    def select_new(
        self, results: Iterable[ResultMessage], total: int
    ) -> tuple[list[ResultMessage], int, int]:
        """Split results into new lines (sorted by line) and drop the rest.

        Returns ``(new, duplicates, invalid)``: a line already seen, or seen twice in this
        chunk, is a duplicate; a line outside ``1..MAX_LINES`` is invalid. ``total`` is not a
        bound: line numbers count every line of the input file, blank lines included, while
        ``total`` counts only request lines, so a file with blank lines has numbers above it.
        Nothing is recorded until :meth:`record`.
        """
        limit = MAX_LINES
        fresh: dict[int, ResultMessage] = {}
        duplicates = invalid = 0
        for result in results:
            line = result.line
            if line is None or not 1 <= line <= limit:
                invalid += 1
            elif line in self.seen or line in fresh:
                duplicates += 1
            else:
                fresh[line] = result
        return [fresh[line] for line in sorted(fresh)], duplicates, invalid

    def record(self, results: Iterable[ResultMessage]) -> None:
        """Mark lines seen and add them to the counts (call once the chunk is stored)."""
        for result in results:
            assert result.line is not None
            self.seen.add(result.line)
            if result.succeeded:
                self.completed += 1
                for key, value in usage_of(result).items():
                    self.usage[key] = self.usage.get(key, 0) + value
            else:
                self.failed += 1

    def usage_document(self) -> dict[str, Any]:
        """The Batch object's ``usage`` field."""
        return usage_document(self.usage)

    @classmethod
    def resumed(cls, batch: BatchDocument) -> BatchState:
        """The state a resumed batch counts on from (``BatchProgressStore.resume``): its stored counts,
        usage and lines with a result, as tallied from its chunks."""
        return cls(
            completed=batch.request_counts.completed,
            failed=batch.request_counts.failed,
            usage=usage_flat(batch.usage.model_dump()),
            seen=SeenLines.from_compressed(batch.seen_lines),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "failed": self.failed,
            "usage": dict(self.usage),
            "seen": self.seen.encode(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> BatchState:
        if not data:
            return cls()
        usage = dict.fromkeys(USAGE_FIELDS, 0)
        usage.update({k: int(v) for k, v in (data.get("usage") or {}).items()})
        return cls(
            completed=int(data.get("completed", 0)),
            failed=int(data.get("failed", 0)),
            usage=usage,
            seen=SeenLines.decode(data.get("seen", "")),
        )
