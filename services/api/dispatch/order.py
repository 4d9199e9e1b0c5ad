"""A batch's dispatch order as the dispatcher reads it: the order object's format, reading it,
and where its groups go.

Validation writes the order object (``services/api/service/dispatch_order.py``): each request
line behind a ``HEADER``. ``OrderCursor`` reads it front to back like the input, and ``Affinity``
sends a prefix group's lines to the partition (worker) whose cache already holds the prefix.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from shared.input_lines import InputLine
from shared.kafka import key_partition
from shared.storage import ObjectStore

# Before each line of the order: input byte offset, length, line number, group id (0: none), rank.
HEADER = struct.Struct("<QIIQI")


@dataclass(frozen=True, slots=True)
class OrderEntry:
    start: int  # the line's byte offset in the input file
    length: int
    number: int
    group: int  # 0: the line shares no long prefix
    rank: int  # its place within the group
    raw: bytes = b""


def read_entries(data: bytes) -> tuple[list[OrderEntry], int]:
    """The whole entries at the front of ``data``, and how many bytes they took."""
    entries: list[OrderEntry] = []
    at, size = 0, HEADER.size
    while len(data) - at >= size:
        start, length, number, group, rank = HEADER.unpack_from(data, at)
        if len(data) - at - size < length:
            break
        entries.append(OrderEntry(start, length, number, group, rank, data[at + size : at + size + length]))
        at += size + length
    return entries, at


class OrderCursor:
    """Reads a batch's lines in its dispatch order, from the order object's entry ``line - 1``
    at byte ``byte`` on; the same surface as ``reader.InputCursor``. ``placed`` holds the entries
    of the lines the last ``take`` returned (their prefix group and rank)."""

    def __init__(self, store: ObjectStore, key: str, line: int = 1, byte: int = 0) -> None:
        self.store, self.key = store, key
        self.line, self.byte = max(1, line), byte
        self.exhausted = False
        self.placed: dict[int, OrderEntry] = {}
        self._chunks: AsyncGenerator[bytes] | None = None
        self._pending = b""
        self._buffer: list[OrderEntry] = []

    async def take(self, count: int) -> list[InputLine]:
        if self._chunks is None:
            self._chunks = self.store.iter_chunks(self.key, offset=self.byte)
        taken: list[OrderEntry] = []
        while len(taken) < count and not self.exhausted:
            if not self._buffer:
                chunk = await anext(self._chunks, None)
                if chunk is None:
                    self.exhausted = True
                    break
                self._pending += chunk
                entries, used = read_entries(self._pending)
                self._pending = self._pending[used:]
                self._buffer = entries[::-1]
                continue
            taken.append(self._buffer.pop())
        self.line += len(taken)
        self.byte += sum(HEADER.size + e.length for e in taken)
        self.placed = {e.number: e for e in taken}
        return [InputLine(e.number, e.start, e.raw) for e in taken]

    async def close(self) -> None:
        chunks, self._chunks = self._chunks, None
        self._pending, self._buffer = b"", []
        if chunks is not None:
            await chunks.aclose()


async def scan_order(store: ObjectStore, key: str, upto_line: int) -> AsyncGenerator[InputLine]:
    """The lines of the order's first ``upto_line - 1`` entries (those an earlier dispatcher sent)."""
    cursor = OrderCursor(store, key)
    try:
        while cursor.line < upto_line and not cursor.exhausted:
            for item in await cursor.take(min(256, upto_line - cursor.line)):
                yield item
    finally:
        await cursor.close()


class Affinity:
    """Which partition of a model's requests topic a prefix group's lines go to.

    A group is cut into slices of ``slice_lines`` (by rank); a slice goes to the partition its
    group id and slice number hash to (the same in every batch and after any restart, so a
    prefix keeps meeting the worker whose cache holds it), unless that partition holds more than
    ``slack_lines`` more of our lines than the emptiest one: then to the emptiest. The choice is
    remembered for the slice's later lines (at most ``max_slices`` choices, least recent first
    forgotten). Lines of no group go where the producer puts them.
    """

    def __init__(self, slice_lines: int, slack_lines: int, max_slices: int = 4096) -> None:
        self.slice_lines, self.slack_lines, self.max_slices = max(1, slice_lines), slack_lines, max_slices
        self._chosen: OrderedDict[tuple[int, int], int] = OrderedDict()

    def partition(self, entry: OrderEntry | None, partitions: int, load: dict[int, int]) -> int | None:
        """The partition for a line (``load``: our lines in each partition, this round's too)."""
        if entry is None or entry.group == 0 or partitions < 2:
            return None
        key = (entry.group, entry.rank // self.slice_lines)
        chosen = self._chosen.get(key)
        if chosen is not None and chosen < partitions:
            self._chosen.move_to_end(key)
            return chosen
        chosen = key_partition(b"%d:%d" % key, partitions)
        emptiest = min(range(partitions), key=lambda p: load.get(p, 0))
        if load.get(chosen, 0) > load.get(emptiest, 0) + self.slack_lines:
            chosen = emptiest
        self._chosen[key] = chosen
        if len(self._chosen) > self.max_slices:
            self._chosen.popitem(last=False)
        return chosen
