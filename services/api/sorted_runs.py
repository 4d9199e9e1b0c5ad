"""Records sorted in bounded memory: runs sorted in memory, spilled to a temporary file, merged.

Used where the api must sort something per input line without holding a line per record in
memory: the dispatch order (``service/dispatch_order.py``) and the custom_id check of validation.
"""

from __future__ import annotations

import heapq
import os
import struct
import tempfile
from collections.abc import Iterator
from typing import IO

_LENGTH = struct.Struct("<I")
READ_BYTES = 128 * 1024
"""Each run's read buffer while merging (a million lines' custom_ids make ~11 runs of 8 MiB:
with 1 MiB buffers validation peaked ~10 MiB higher)."""


class SortedRuns:
    """Records sorted in runs of at most ``run_bytes``, spilled to one temporary file (each record
    behind its length), then merged: memory holds one run, plus a read buffer per run."""

    def __init__(self, run_bytes: int) -> None:
        self.run_bytes = run_bytes
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._spill: IO[bytes] | None = None
        self._runs: list[tuple[int, int]] = []  # (offset, bytes) in the spill file

    def add(self, record: bytes) -> None:
        self._pending.append(record)
        self._pending_bytes += len(record) + 64  # and the list's and object's own share
        if self._pending_bytes >= self.run_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._spill is None:
            self._spill = tempfile.TemporaryFile()
        self._pending.sort()
        offset = self._spill.seek(0, os.SEEK_END)
        self._spill.write(b"".join(_LENGTH.pack(len(r)) + r for r in self._pending))
        self._runs.append((offset, self._spill.tell() - offset))
        self._pending, self._pending_bytes = [], 0

    def _read_run(self, offset: int, size: int) -> Iterator[bytes]:
        assert self._spill is not None
        spill, end, at = self._spill, offset + size, offset
        buffer, pos = b"", 0  # records are read at ``pos``; the buffer is cut once per chunk read
        while True:
            while len(buffer) - pos >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(buffer, pos)
                start = pos + _LENGTH.size
                if len(buffer) < start + length:
                    break
                yield buffer[start : start + length]
                pos = start + length
            if at >= end:
                return
            spill.seek(at)
            chunk = spill.read(min(READ_BYTES, end - at))
            at += len(chunk)
            buffer, pos = buffer[pos:] + chunk, 0

    def sorted(self) -> Iterator[bytes]:
        """Every record in byte order (may be walked more than once)."""
        if self._spill is None:
            self._pending.sort()
            yield from self._pending
            return
        self._flush()
        yield from heapq.merge(*(self._read_run(o, n) for o, n in self._runs))

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None
