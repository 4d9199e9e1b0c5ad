"""A batch's input lines read from object storage from a saved position, one chunk held at a time."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from shared.input_lines import InputLine, is_request, numbered_lines
from shared.storage import ObjectStore

__all__ = ["InputCursor", "InputLine", "read_line", "read_lines", "scan"]


class InputCursor:
    """Reads a batch's input from line ``line`` at byte ``byte`` onwards; ``take`` request lines.

    ``line``/``byte`` always name the next line not yet returned, so they are the position to
    persist once the lines returned so far are on Kafka.
    """

    def __init__(self, store: ObjectStore, key: str, line: int = 1, byte: int = 0) -> None:
        self.store, self.key = store, key
        self.line, self.byte = line, byte
        self.exhausted = False
        self._lines: AsyncGenerator[InputLine] | None = None

    async def take(self, count: int) -> list[InputLine]:
        """Up to ``count`` request (non-blank) lines; fewer only at the end of the file."""
        if self._lines is None:
            self._lines = self._iterate()
        taken: list[InputLine] = []
        while len(taken) < count and not self.exhausted:
            item = await anext(self._lines, None)
            if item is None:
                self.exhausted = True
                break
            self.line, self.byte = item.number + 1, item.start + item.size + 1
            if is_request(item.raw):
                taken.append(item)
        return taken

    async def close(self) -> None:
        lines, self._lines = self._lines, None
        if lines is not None:
            await lines.aclose()

    def _iterate(self) -> AsyncGenerator[InputLine]:
        return numbered_lines(self.store.iter_chunks(self.key, offset=self.byte), self.line, self.byte)


# Lines whose byte ranges lie closer than this are read with one ranged GET.
MERGE_GAP = 256 * 1024


async def read_line(store: ObjectStore, key: str, start: int, length: int) -> bytes:
    """One line by its byte range (a line sent again)."""
    parts = [chunk async for chunk in store.iter_chunks(key, offset=start, length=max(length, 1))]
    return b"".join(parts)[:length]


async def read_lines(store: ObjectStore, key: str, spans: list[tuple[int, int]]) -> list[bytes]:
    """Lines by ``(start, length)``, in the order given; near ranges share one GET."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    found: dict[int, bytes] = {}
    group: list[int] = []

    async def flush() -> None:
        first = spans[group[0]][0]
        last = max(spans[i][0] + spans[i][1] for i in group)
        block = await read_line(store, key, first, last - first)
        for i in group:
            start, length = spans[i]
            found[i] = block[start - first : start - first + length]
        group.clear()

    for i in order:
        if group and spans[i][0] - max(spans[j][0] + spans[j][1] for j in group) > MERGE_GAP:
            await flush()
        group.append(i)
    if group:
        await flush()
    return [found[i] for i in range(len(spans))]


async def scan(store: ObjectStore, key: str, upto_line: int, upto_byte: int) -> AsyncGenerator[InputLine]:
    """Every request line before line ``upto_line`` at byte ``upto_byte`` (a takeover's check
    of the lines an earlier dispatcher sent)."""
    cursor = InputCursor(store, key)
    try:
        while cursor.byte < upto_byte and not cursor.exhausted:
            for item in await cursor.take(256):
                if item.start < upto_byte and item.number < upto_line:
                    yield item
    finally:
        await cursor.close()
