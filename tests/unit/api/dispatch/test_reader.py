"""Reading a batch's input from a saved position (an in-memory fake object store, tiny chunks)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

from services.api.dispatch.reader import InputCursor, read_line, read_lines, scan
from shared.storage import ObjectStore

DATA = b'{"n":1}\n\n{"n":3}\n{"n":4}\n\n{"n":6}'


class FakeObjectStore:
    """Serves one object from memory in 5-byte chunks, honouring offset and length."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def iter_chunks(self, key: str, offset: int = 0, length: int = 0) -> AsyncIterator[bytes]:
        end = offset + length if length else len(self.data)
        for start in range(offset, end, 5):
            yield self.data[start : min(start + 5, end)]


def store() -> ObjectStore:
    return cast(ObjectStore, FakeObjectStore(DATA))


async def test_lines_keep_the_files_numbering_and_byte_offsets_across_blank_lines() -> None:
    cursor = InputCursor(store(), "k")
    first = await cursor.take(2)
    assert [(i.number, i.raw) for i in first] == [(1, b'{"n":1}'), (3, b'{"n":3}')]
    assert (cursor.line, cursor.byte) == (4, DATA.index(b'{"n":4}'))
    resumed = InputCursor(store(), "k", cursor.line, cursor.byte)  # a new dispatcher resumes
    rest = await resumed.take(10)
    assert [(i.number, i.raw) for i in rest] == [(4, b'{"n":4}'), (6, b'{"n":6}')]
    assert resumed.exhausted
    for item in first + rest:
        assert await read_line(store(), "k", item.start, len(item.raw)) == item.raw
    await cursor.close()


async def test_a_scan_returns_the_lines_before_a_position() -> None:
    upto = DATA.index(b'{"n":4}')
    found: list[Any] = [i.number async for i in scan(store(), "k", 4, upto)]
    assert found == [1, 3]


async def test_lines_read_by_range_come_back_in_the_order_asked() -> None:
    spans = [(DATA.index(b'{"n":6}'), 7), (0, 7), (DATA.index(b'{"n":3}'), 7)]
    assert await read_lines(store(), "k", spans) == [b'{"n":6}', b'{"n":1}', b'{"n":3}']
    assert await read_lines(store(), "k", []) == []
