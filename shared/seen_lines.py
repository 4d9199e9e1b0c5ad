"""The seen-lines bitmap: which 1-based line numbers of a batch have been handled.

One definition for both readers of result chunks: the aggregator keeps one per batch in its state
table (the source of truth for dropping a result delivered twice), and the api's partial output
keeps one per stream to send each line once; the api's dispatcher reads the copy the
aggregator's counts flush writes to the batch document to find lines that were lost. 50,000
lines take 6.25 KB; ``encode`` compresses it for the table's changelog (a few bytes once every
line is seen).
"""

from __future__ import annotations

import base64
import zlib

MAX_LINE_NUMBER = 16_000_000
"""The largest input line number (blank lines count) any service takes: validation refuses a file
with more, and the aggregator drops a result beyond it as corrupt (its bitmap: 2 MB at most)."""


class SeenLines:
    """A growable bitmap of 1-based line numbers."""

    def __init__(self, bits: bytes | bytearray = b"") -> None:
        self._bits = bytearray(bits)

    def __contains__(self, line: int) -> bool:
        index = line - 1
        byte = index >> 3
        return index >= 0 and byte < len(self._bits) and bool(self._bits[byte] & (1 << (index & 7)))

    def add(self, line: int) -> None:
        """Mark ``line`` (>= 1) seen."""
        index = line - 1
        if index < 0:
            raise ValueError(f"line numbers start at 1, not {line}")
        byte = index >> 3
        if byte >= len(self._bits):
            self._bits.extend(bytes(byte + 1 - len(self._bits)))
        self._bits[byte] |= 1 << (index & 7)

    def count(self) -> int:
        return sum(b.bit_count() for b in self._bits)

    def count_below(self, line: int) -> int:
        """How many lines numbered below ``line`` are seen."""
        whole, rest = divmod(line - 1, 8)
        count = sum(b.bit_count() for b in self._bits[:whole])
        if rest and whole < len(self._bits):
            count += (self._bits[whole] & ((1 << rest) - 1)).bit_count()
        return count

    def compressed(self) -> bytes:
        """zlib-compressed: how a batch document stores it (``seen_lines``)."""
        return zlib.compress(bytes(self._bits), 6)

    def encode(self) -> str:
        """zlib-compressed, base64-encoded: how the aggregator's state table stores it."""
        return base64.b64encode(zlib.compress(bytes(self._bits), 6)).decode()

    @classmethod
    def decode(cls, text: str) -> SeenLines:
        return cls(zlib.decompress(base64.b64decode(text)) if text else b"")

    @classmethod
    def from_compressed(cls, stored: bytes | None) -> SeenLines:
        """The zlib bytes the aggregator's counts flush writes to the batch (``seen_lines``)."""
        return cls(zlib.decompress(stored) if stored else b"")
